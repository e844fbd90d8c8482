"""The audit store's database: the URL, the engine, and the schema migrations.

SQLite (the default, a file) runs in WAL mode with a busy timeout, so several processes can
write; PostgreSQL is the other supported database. A URL that cannot name a usable store is a
clear :class:`AuditStoreError` before anything is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.pool import NullPool

from kmq_dagster.errors import AuditStoreError, ConfigError
from kmq_dagster.home import (
    PRIVATE_FILE_MODE,
    kmq_home,
    private_file,
    private_folder,
    private_if_present,
    warn_if_shared,
)
from kmq_dagster.secrets import mask_text, mask_url

#: Environment variable naming the store; default: a SQLite file in ``~/.kmq``.
URL_ENV = "KMQ_AUDIT_URL"
SQLITE_BUSY_TIMEOUT_MS = 30_000
HEAD_REVISION = "0005"


def default_url() -> str:
    """``$KMQ_AUDIT_URL``, else ``sqlite:///~/.kmq/audit.db``."""
    configured = os.environ.get(URL_ENV)
    if configured:
        return configured
    path = private_folder(kmq_home()) / "audit.db"
    return f"sqlite:///{path}"


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent; safe if several processes race:
    PostgreSQL takes an advisory lock, a SQLite file a lock file beside it)."""
    with _sqlite_migration_lock(engine):
        _upgrade(engine)


def _upgrade(engine: Engine) -> None:
    config = Config()
    config.set_main_option("script_location", "kmq_dagster.audit:migrations")
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":  # one migrator at a time
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(4242001)")
        current = MigrationContext.configure(connection).get_current_revision()
        if current == HEAD_REVISION:
            return
        config.attributes["connection"] = connection
        try:
            command.upgrade(config, "head")
        except CommandError:
            raise AuditStoreError(
                f"the audit store's schema is at revision {current}, which this kmq "
                f"(revision {HEAD_REVISION}) does not know: it was written by a newer kmq; "
                "upgrade kmq-dagster"
            ) from None


@contextlib.contextmanager
def _sqlite_migration_lock(engine: Engine) -> Iterator[None]:
    """One migrator at a time per SQLite file: an exclusive lock on ``<file>.migrate.lock``,
    removed when done so that it does not litter the store's folder. The holder removes it
    while still holding the lock; a process that was waiting on the removed file sees that its
    file is no longer the one at the path and locks the new one."""
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    path = Path(f"{database}.migrate.lock")
    while True:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, PRIVATE_FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _still_at(fd, path):
                continue  # the holder before us removed it: lock the one at the path now
            try:
                yield
            finally:
                path.unlink(missing_ok=True)  # still locked: a waiter sees it is gone
            return
        finally:
            os.close(fd)  # releases the lock


def _still_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the file at ``path`` (not removed or replaced)."""
    try:
        at_path = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (at_path.st_dev, at_path.st_ino)


def schema_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def engine_for(url: str) -> Engine:
    """An engine for ``url``; a URL that cannot name a usable store is a clear error.

    Raises:
        AuditStoreError: malformed URL, unknown or uninstalled driver, in-memory SQLite.
    """
    shown = mask_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise AuditStoreError(
            f"not a database URL: {shown} (examples: sqlite:////var/lib/kmq/audit.db, "
            "postgresql+psycopg://user:password@host:5432/kmq)"
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise AuditStoreError(
            f"{shown} is an in-memory database: every process would see its own empty audit "
            "store; give a file, e.g. sqlite:////var/lib/kmq/audit.db"
        )
    folder = Path(parsed.database or ".").expanduser().parent
    if parsed.get_backend_name() == "sqlite" and not folder.is_dir():
        raise AuditStoreError(
            f"the folder of the audit store {shown} does not exist: create {folder} first"
        )
    try:
        if parsed.get_backend_name() != "sqlite":
            return create_engine(url, pool_pre_ping=True)
        try:
            _private_sqlite_files(Path(parsed.database or "").expanduser())
        except OSError as exc:
            raise AuditStoreError(
                f"cannot open the audit store {shown}: {exc.strerror or exc}"
            ) from None
        return _sqlite_engine(url)
    except NoSuchModuleError:
        raise AuditStoreError(
            f"unknown database in {shown}: kmq's audit store runs on SQLite or PostgreSQL"
        ) from None
    except ImportError as exc:
        raise AuditStoreError(
            f"the database driver for {shown} is not installed ({exc}); for PostgreSQL, "
            "pip install 'psycopg[binary]' (the postgres extra: pip install -e '.[postgres]' "
            "in a clone)"
        ) from None


def _private_sqlite_files(database: Path) -> None:
    """The store's file ``0600`` before SQLite opens it (its WAL and shared-memory files take
    its mode); a folder that exposes it gets a warning (:func:`warn_if_shared`)."""
    warn_if_shared(database.parent)
    private_file(database)
    for companion in ("-wal", "-shm"):
        private_if_present(database.with_name(database.name + companion))


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(
        url, poolclass=NullPool, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    return engine


def insert_ignoring_duplicates(engine: Engine, model: type[Any], unique: list[str]) -> Any:
    if engine.dialect.name == "postgresql":
        return postgresql.insert(model).on_conflict_do_nothing(index_elements=unique)
    if engine.dialect.name == "sqlite":
        return sqlite.insert(model).on_conflict_do_nothing(index_elements=unique)
    raise ConfigError(f"the audit store supports SQLite and PostgreSQL, not {engine.dialect.name}")


def failure_reason(exc: BaseException) -> str:
    """What went wrong, in the database's words, without SQLAlchemy's boilerplate or secrets."""
    original = exc.orig if isinstance(exc, DBAPIError) else exc
    first_line = str(original).strip().splitlines()[0] if str(original).strip() else repr(exc)
    return mask_text(first_line)
