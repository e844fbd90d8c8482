"""Loopback port checks and free-port picking (ports are chosen at run time, never fixed)."""

from __future__ import annotations

import errno
import random
import socket

from kmq_dagster.errors import BrokerError

#: Ports picked for helper servers come from here, below the usual ephemeral range.
_PICK_RANGE = (15_000, 30_000)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could listen on ``host:port`` now (nothing else listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1", paired_offset: int = 0) -> int:
    """A port free on ``host``; with ``paired_offset``, ``port + paired_offset`` is free too.

    SeaweedFS serves gRPC on its HTTP port + 10000, hence the pair.

    Raises:
        BrokerError: no such port was found after many tries.
    """
    rng = random.Random()
    low, high = _PICK_RANGE
    for _ in range(200):
        port = rng.randrange(low, high)
        if port_is_free(port, host) and (
            paired_offset == 0 or port_is_free(port + paired_offset, host)
        ):
            return port
    raise BrokerError(f"no free port found on {host} in {low}-{high}")
