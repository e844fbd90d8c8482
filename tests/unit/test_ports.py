"""Which process listens on a port, for the broker's "port in use" errors (read from /proc)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from kmq_dagster.broker.ports import free_port, who_listens
from kmq_dagster.broker.seaweed import SeaweedS3
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
