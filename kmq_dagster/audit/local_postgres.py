"""A throwaway PostgreSQL server from the machine's binaries (Debian's ``postgresql``), on a
free loopback port: for tests and ``kmq bench audit``, never for production data.

As root, the server runs as the ``postgres`` user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from kmq_dagster.broker.ports import free_port
from kmq_dagster.broker.process import ManagedProcess
from kmq_dagster.core.lifecycle import Service
from kmq_dagster.errors import AuditStoreError

USER = "kmq"
DATABASE = "kmq"


def postgres_bindir() -> Path | None:
    """Where initdb and postgres are (Debian keeps them out of PATH), or ``None``."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None


def fresh_database(server_url: str) -> str:
    """Create an empty database on the server of ``server_url`` (a SQLAlchemy
    ``postgresql+psycopg://`` URL); returns its URL."""
    import psycopg

    name = f"kmq_{uuid.uuid4().hex[:12]}"
    base = server_url.rsplit("/", 1)[0]
    plain = base.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(f"{plain}/postgres", autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")  # a generated name, no user input
    return f"{base}/{name}"


class PostgresServer(Service):
    """One throwaway cluster in its own temporary directory (removed by :meth:`stop`)."""

    def __init__(self) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise AuditStoreError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bindir = bindir
        # Not under pytest's 0700 temporary tree: the postgres user must reach it.
        self.base_dir = Path(tempfile.mkdtemp(prefix="kmq-postgres-"))
        self.data_dir = self.base_dir / "pgdata"
        self.port = free_port()
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self._process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> None:
        if self._as_postgres:
            shutil.chown(self.base_dir, "postgres", "postgres")
        initdb = subprocess.run(
            [*self._as_postgres, str(self.bindir / "initdb"), "-D", str(self.data_dir),
             "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if initdb.returncode != 0:
            raise AuditStoreError(f"initdb failed: {initdb.stderr.strip()[-2000:]}")
        self._process = ManagedProcess(
            "postgres",
            [*self._as_postgres, str(self.bindir / "postgres"), "-D", str(self.data_dir),
             "-p", str(self.port), "-k", str(self.data_dir), "-c", "listen_addresses=127.0.0.1",
             "-c", "fsync=off"],
            self.base_dir / "postgres.log",
            stop_signal=signal.SIGINT,  # fast shutdown: do not wait for clients to leave
        )  # fmt: skip
        self._process.start()
        self._wait_and_create_database()

    def _wait_and_create_database(self, timeout_s: float = 60) -> None:
        try:
            import psycopg
        except ImportError:
            raise AuditStoreError(
                "PostgreSQL support needs psycopg: pip install 'psycopg[binary]' (the postgres "
                "extra: pip install -e '.[postgres]' in a clone)"
            ) from None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(
                    host="127.0.0.1", port=self.port, user=USER, dbname="postgres", autocommit=True
                ) as connection:
                    connection.execute(f"CREATE DATABASE {DATABASE}")
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or (
                    self._process and self._process.exit_code() is not None
                ):
                    log = (self.base_dir / "postgres.log").read_text(errors="replace")[-2000:]
                    raise AuditStoreError(f"PostgreSQL did not start:\n{log}") from None
                time.sleep(0.2)

    def halt(self) -> None:
        """Stop the server and keep its data: clients get "connection refused" until
        :meth:`resume` (an outage of the audit store, for fault tests)."""
        if self._process is not None:
            self._process.stop()

    def resume(self, timeout_s: float = 60) -> None:
        """Start a halted server again, on the same port and data, and wait until it serves.

        Raises:
            AuditStoreError: it did not accept connections within ``timeout_s``.
        """
        assert self._process is not None, "resume() follows start() and halt()"
        self._process.start()
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(
                    host="127.0.0.1", port=self.port, user=USER, dbname=DATABASE, autocommit=True
                ):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self._process.exit_code() is not None:
                    log = (self.base_dir / "postgres.log").read_text(errors="replace")[-2000:]
                    raise AuditStoreError(f"PostgreSQL did not start again:\n{log}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)
