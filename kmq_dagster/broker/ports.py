"""Loopback port checks and free-port picking (ports are chosen at run time, never fixed)."""

from __future__ import annotations

import errno
import os
import random
import socket
import time
from collections.abc import Collection
from pathlib import Path

from kmq_dagster.errors import BrokerError

#: Ports picked for helper servers come from here, below the usual ephemeral range.
_PICK_RANGE = (15_000, 30_000)
#: Where the kernel takes the local ports of outgoing connections, when it does not say.
_DEFAULT_EPHEMERAL_RANGE = (32_768, 60_999)
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


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


def free_port(host: str = "127.0.0.1", paired_offset: int = 0, avoid: Collection[int] = ()) -> int:
    """A port free on ``host``; with ``paired_offset``, ``port + paired_offset`` is free too.
    Neither is in ``avoid``: ports promised to servers that do not listen yet.

    SeaweedFS serves gRPC on its HTTP port + 10000, hence the pair. Neither port is in the
    kernel's ephemeral range when the pick range allows it: any outgoing connection (SeaweedFS's
    own components dialling each other while they start) may take such a port between the
    pick and the server's bind, and the server then fails after it was reported ready.

    Raises:
        BrokerError: no such port was found after many tries.
    """
    rng = random.Random()
    low, high = _PICK_RANGE
    candidates = _outside_ephemeral_range(low, high, paired_offset) or [(low, high)]
    for _ in range(200):
        start, end = rng.choices(candidates, weights=[e - s for s, e in candidates])[0]
        port = rng.randrange(start, end)
        paired = port + paired_offset if paired_offset else None
        if port in avoid or paired in avoid:
            continue
        if port_is_free(port, host) and (paired is None or port_is_free(paired, host)):
            return port
    raise BrokerError(f"no free port found on {host} in {low}-{high}")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections, both ends included."""
    try:
        first, last = _EPHEMERAL_RANGE_FILE.read_text().split()
        return int(first), int(last)
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL_RANGE


def _outside_ephemeral_range(low: int, high: int, paired_offset: int) -> list[tuple[int, int]]:
    """The parts of ``low``-``high`` (end excluded) whose ports, and their partners at
    ``+ paired_offset``, all lie outside the ephemeral range; empty if there are none."""
    first, last = ephemeral_range()
    below = (low, min(high, first - paired_offset))
    above = (max(low, last + 1), high)
    return [(start, end) for start, end in (below, above) if start < end]


#: ``st`` of a listening socket in ``/proc/net/tcp``.
_TCP_LISTEN = "0A"
#: What :func:`who_listens` says of a listener no process it can see holds.
NO_VISIBLE_PROCESS = "no process this user can see (a socket still closing, or another user's)"


def who_listens(port: int) -> str | None:
    """``pid N (command line)`` of the process listening on TCP ``port`` (any address), read
    from ``/proc``; ``None`` if nothing listens there (or not Linux), and
    :data:`NO_VISIBLE_PROCESS` for a listener whose process is not to be seen: another user's,
    or one that just died (the kernel closes its socket a moment after the process is gone)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and wanted & _fd_targets(entry):
            try:
                command = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:  # gone meanwhile
                continue
            one_line = " ".join(command.replace("\0", " ").split())
            return f"pid {entry.name} ({one_line[:120]})"
    return NO_VISIBLE_PROCESS


def _fd_targets(process: Path) -> set[str]:
    """What ``process``'s file descriptors point at; those that close meanwhile (the listing's
    own, for this process) and processes not ours to read are skipped."""
    targets: set[str] = set()
    try:
        fds = list((process / "fd").iterdir())
    except OSError:
        return targets
    for fd in fds:
        try:
            targets.add(os.readlink(fd))
        except OSError:
            continue
    return targets


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def wait_until_free(port: int, host: str, timeout_s: float) -> bool:
    """Whether ``host:port`` is free, waiting up to ``timeout_s`` for it to become so."""
    deadline = time.monotonic() + timeout_s
    while not port_is_free(port, host):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
