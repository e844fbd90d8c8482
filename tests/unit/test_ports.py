"""Which process listens on a port, for the broker's "port in use" errors (read from /proc),
and which ports are picked for servers that do not listen yet."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from kmq_dagster.broker import ports
from kmq_dagster.broker.ports import ephemeral_range, free_port, who_listens
from kmq_dagster.broker.seaweed import GRPC_PORT_OFFSET, SeaweedS3
from kmq_dagster.errors import BrokerError
from tests.support.port_window import narrow_pick_range


def test_the_process_listening_on_a_port_is_named_and_none_once_it_stops() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert who_listens(port) is None  # bound, not listening: it serves nothing
        server.listen()
        holder = who_listens(port)
        assert holder is not None and holder.startswith(f"pid {os.getpid()} (")
        assert "python" in holder or "pytest" in holder
    assert who_listens(port) is None


def test_seaweedfs_components_get_ports_of_their_own_clear_of_the_brokers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Nothing listens on them until ``weed mini`` starts: a free-port check alone let two
    # components, or a component and the broker, take one port.
    window = narrow_pick_range(monkeypatch, 6)
    broker_port = window[2]

    chosen = SeaweedS3(tmp_path, tmp_path / "log", avoid=(broker_port,)).ports.values()

    assert sorted(chosen) == [port for port in window if port != broker_port]


def test_a_port_promised_elsewhere_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    window = narrow_pick_range(monkeypatch, 2)

    assert {free_port(avoid=(window[0],)) for _ in range(20)} == {window[1]}
    with pytest.raises(BrokerError, match="no free port"):
        free_port(avoid=window)


def _ephemeral(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, first: int, last: int) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text(f"{first}\t{last}\n")
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE_FILE", range_file)


def test_no_port_is_picked_where_outgoing_connections_take_theirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # CI once saw a durable broker die after it was reported ready: a port promised to
    # SeaweedFS lay in the kernel's ephemeral range, where any client connection (SeaweedFS's
    # own components dialling each other) may take it before the server binds it.
    window = narrow_pick_range(monkeypatch, 6)
    _ephemeral(monkeypatch, tmp_path, window[2], window[3])

    picked = {free_port() for _ in range(40)}

    assert picked == {window[0], window[1], window[4], window[5]}


def test_a_paired_port_is_kept_out_of_the_ephemeral_range_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    window = narrow_pick_range(monkeypatch, 6)
    # The partners of the window's last two ports are ephemeral: only the first four are left.
    _ephemeral(monkeypatch, tmp_path, window[4] + GRPC_PORT_OFFSET, 60_999)

    picked = {free_port(paired_offset=GRPC_PORT_OFFSET) for _ in range(40)}

    assert picked == set(window[:4])


def test_ports_are_still_picked_where_the_whole_range_is_ephemeral(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    window = narrow_pick_range(monkeypatch, 2)
    _ephemeral(monkeypatch, tmp_path, 1_024, 65_535)

    assert {free_port() for _ in range(20)} == set(window)


def test_seaweedfs_ports_and_their_grpc_partners_lie_outside_this_machines_ephemeral_range(
    tmp_path: Path,
) -> None:
    first, last = ephemeral_range()

    chosen = SeaweedS3(tmp_path, tmp_path / "log").ports.values()

    assert all(
        not first <= port <= last and not first <= port + GRPC_PORT_OFFSET <= last
        for port in chosen
    ), (sorted(chosen), (first, last))


def test_the_usual_ephemeral_range_is_assumed_where_the_kernel_does_not_say(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE_FILE", tmp_path / "missing")

    assert ephemeral_range() == (32_768, 60_999)
