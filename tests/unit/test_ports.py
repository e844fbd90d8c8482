"""Which process listens on a port, for the broker's "port in use" errors (read from /proc)."""

from __future__ import annotations

import os
import socket

from kmq_dagster.broker.ports import who_listens


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
