"""Dagster's webserver and daemon as child processes, on a free port and a private
``DAGSTER_HOME``: what ``kmq demo --ui`` runs and the end-to-end tests drive over GraphQL.

Each process gets a process group of its own, so stopping it stops the code servers and run
workers it started too.

Examples:
    >>> with DagsterService(Path("workspace.yaml"), home=Path("/tmp/dg")) as dagster:
    ...     print(dagster.url)                                       # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kmq_dagster.broker.ports import free_port
from kmq_dagster.child_processes import spawn_in_group, stop_groups
from kmq_dagster.core.lifecycle import Service
from kmq_dagster.errors import KmqError, KmqTimeoutError

#: The instance configuration: runs are monitored (a run worker that never starts is failed),
#: telemetry is off, and the daemon evaluates sensors in threads.
DAGSTER_YAML = """\
telemetry:
  enabled: false
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  poll_interval_seconds: 5
sensors:
  use_threads: true
  num_workers: 4
"""


class DagsterService(Service):
    """``dagster-webserver`` and ``dagster-daemon`` on ``workspace``.

    Args:
        home: the ``DAGSTER_HOME`` (created, with a ``dagster.yaml``, if missing).
        env: extra environment for both processes (``KMQ_BOOTSTRAP_SERVERS``, ...).
        log_dir: where their output goes (default: ``home``).
    """

    def __init__(
        self,
        workspace: Path,
        *,
        home: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.workspace = workspace.resolve()
        self.home = home
        self.port = port or free_port()
        self.env = {**os.environ, **(env or {}), "DAGSTER_HOME": str(home)}
        self.log_dir = log_dir or home
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180) -> DagsterService:
        """Start both processes and wait until the webserver has loaded the code location.

        Raises:
            KmqTimeoutError: the webserver did not answer in time.
            KmqError: a process exited while starting.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "dagster.yaml"
        if not config.exists():
            config.write_text(DAGSTER_YAML)
        bin_dir = Path(sys.executable).parent
        where = ["-w", str(self.workspace)]
        self._spawn(
            "webserver",
            [str(bin_dir / "dagster-webserver"), *where, "-h", "127.0.0.1", "-p", str(self.port)],
        )
        # The daemon starts once the webserver has created the instance's storage: two fresh
        # processes migrating one SQLite schema at once leave it with two alembic heads.
        self._wait_until_loaded(timeout_s)
        self._spawn("daemon", [str(bin_dir / "dagster-daemon"), "run", *where])
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.processes[name] = spawn_in_group(
            argv,
            log_file=self.log_dir / f"dagster-{name}.log",
            env=self.env,
            cwd=self.workspace.parent,
        )

    def _wait_until_loaded(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise KmqError(
                        f"dagster {name} exited with {process.returncode}; see "
                        f"{self.log_dir / f'dagster-{name}.log'}"
                    )
            with contextlib.suppress(OSError):  # not listening yet
                if self.location_name() is not None:
                    return
            time.sleep(0.5)
        raise KmqTimeoutError(f"the Dagster webserver did not load the code within {timeout_s} s")

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """One GraphQL request; returns its ``data``.

        Raises:
            KmqError: the server answered with errors.
        """
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        if answer.get("errors"):
            raise KmqError(f"Dagster GraphQL errors: {answer['errors']}")
        return answer["data"]  # type: ignore[no-any-return]

    def location_name(self) -> str | None:
        """The loaded code location's name (``None`` while it loads)."""
        data = self.graphql(
            "{ workspaceOrError { ... on Workspace { locationEntries { name "
            "locationOrLoadError { __typename } } } } }"
        )
        for entry in data["workspaceOrError"].get("locationEntries", []):
            if entry["locationOrLoadError"] and (
                entry["locationOrLoadError"]["__typename"] == "RepositoryLocation"
            ):
                return str(entry["name"])
            if (
                entry["locationOrLoadError"]
                and "Error" in entry["locationOrLoadError"]["__typename"]
            ):
                raise KmqError(f"the code location {entry['name']} failed to load")
        return None

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM each process group, then SIGKILL what is left."""
        stop_groups(self.processes.values(), timeout_s)
        self.processes.clear()
