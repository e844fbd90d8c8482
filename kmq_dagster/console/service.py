"""The console as a child process (what ``kmq demo --ui`` runs beside Dagster): Streamlit
serving the console on a free loopback port, without login (loopback only, as ``kmq console
--no-auth``), stopped with its process group.

Examples:
    >>> with ConsoleService(settings, audit_url, log_dir=Path("/tmp/c")) as console:
    ...     print(console.url)                                       # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from kmq_dagster.broker.ports import free_port
from kmq_dagster.child_processes import spawn_in_group, stop_groups
from kmq_dagster.console.launcher import LaunchOptions, check, environment, streamlit_argv
from kmq_dagster.core.lifecycle import Service
from kmq_dagster.errors import KmqError, KmqTimeoutError
from kmq_dagster.settings import KmqSettings

LOOPBACK = "127.0.0.1"


class ConsoleService(Service):
    """The console on ``127.0.0.1`` without login, reading ``audit_url``."""

    def __init__(
        self, settings: KmqSettings, audit_url: str, *, log_dir: Path, port: int | None = None
    ) -> None:
        self.options = LaunchOptions(
            port=port or free_port(), address=LOOPBACK, audit_url=audit_url, no_auth=True
        )
        self.settings = settings
        self.log_file = log_dir / "console.log"
        self.users_file = log_dir / "console-users.json"  # unused without login
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.options.port}"

    def start(self, timeout_s: float = 60) -> ConsoleService:
        """Start Streamlit and wait until it answers its health check.

        Raises:
            ConfigError, AuditStoreError: the options or the audit store are unusable.
            KmqError: Streamlit exited while starting.
            KmqTimeoutError: it did not answer within ``timeout_s``.
        """
        check(self.options, self.users_file, secrets=[])
        env = environment(self.options, self.users_file, self.settings, os.environ)
        self.process = spawn_in_group(streamlit_argv(self.options), log_file=self.log_file, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KmqError(
                    f"the console exited with {self.process.returncode}; see {self.log_file}"
                )
            health = f"{self.url}/_stcore/health"
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=5) as answer:
                if answer.read().strip() == b"ok":
                    return self
            time.sleep(0.5)
        raise KmqTimeoutError(f"the console did not answer within {timeout_s:g} s")

    def stop(self, timeout_s: float = 15) -> None:
        if self.process is not None:
            stop_groups([self.process], timeout_s)
            self.process = None
