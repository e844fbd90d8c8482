"""The scratch audit stores ``kmq bench console`` fills and times: a SQLite file and a fresh
PostgreSQL database, each created when its measurement starts and gone after it.

The measurement itself is in :mod:`kmq_dagster.bench.console_queries`.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

#: A scratch store: entering it yields its SQLAlchemy URL; leaving it lets it go.
ScratchStore = Callable[[], contextlib.AbstractContextManager[str]]


def scratch_stores(postgres_url: str | None) -> dict[str, ScratchStore]:
    """A SQLite store and a PostgreSQL one: a fresh database on ``postgres_url``'s server, or
    on a throwaway server started from the machine's PostgreSQL binaries when it is ``None``."""
    return {"sqlite": _sqlite, "postgres": lambda: _postgres(postgres_url)}


@contextlib.contextmanager
def _sqlite() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kmq-bench-console-") as scratch:
        yield f"sqlite:///{Path(scratch) / 'audit.db'}"


@contextlib.contextmanager
def _postgres(server_url: str | None) -> Iterator[str]:
    from kmq_dagster.audit.local_postgres import PostgresServer, fresh_database

    if server_url is not None:
        yield fresh_database(server_url)
        return
    with PostgresServer() as server:
        yield server.url
