"""The example dg project (examples/kmq-orders) as its user runs it: ``dg`` commands in its
folder, and ``dg dev`` (webserver and daemon) in a process group of its own.

The example is not installed: its ``src/`` goes on ``PYTHONPATH`` (after the repository, so
``kmq_dagster`` is this checkout's), which is how ``dg`` finds the project's root module when
the project has no virtual environment of its own. kmq-dagster itself must be installed
(``pip install -e '.[test]'``): ``dg list components`` finds the component through the
package's ``dagster_dg_cli.registry_modules`` entry point.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kmq_dagster.child_processes import spawn_in_group
from kmq_dagster.demo.dagster_service import DAGSTER_YAML, DagsterService

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kmq-orders"
DG = Path(sys.executable).parent / "dg"


def project_env(extra: dict[str, str] | None = None, project: Path = EXAMPLE) -> dict[str, str]:
    """The environment ``dg`` runs in: the project importable, telemetry off, and every
    warning printed (``default``), so that one of ours would show in the output."""
    path = [str(ROOT), str(project / "src"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "DAGSTER_DISABLE_TELEMETRY": "1",
        "PYTHONWARNINGS": "default",
        **(extra or {}),
    }


def run_dg(*args: str, project: Path = EXAMPLE) -> subprocess.CompletedProcess[str]:
    """``dg ARGS`` in the project's folder; its output (stdout and stderr) in ``.stdout``."""
    return subprocess.run(
        [str(DG), *args],
        cwd=project,
        env=project_env(project=project),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
        check=False,
    )


def own_warnings(output: str) -> list[str]:
    """Lines of ``output`` that report a warning raised in kmq-dagster's code."""
    lines = output.splitlines()
    return [
        f"{line}\n{lines[i + 1] if i + 1 < len(lines) else ''}"
        for i, line in enumerate(lines)
        if "Warning" in line and "kmq_dagster" in line
    ]


class DgDev(DagsterService):
    """``dg dev`` in the example's folder: one process that starts the webserver, the daemon
    and the code server, stopped with them as one process group."""

    def __init__(self, *, home: Path, env: dict[str, str]) -> None:
        super().__init__(EXAMPLE, home=home, env=env)

    def start(self, timeout_s: float = 240) -> DgDev:
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "dagster.yaml"
        if not config.exists():
            config.write_text(DAGSTER_YAML)
        argv = [str(DG), "dev", "--host", "127.0.0.1", "--port", str(self.port)]
        self.processes["dg-dev"] = spawn_in_group(
            argv, log_file=self.log_dir / "dg-dev.log", env=self.env, cwd=EXAMPLE
        )
        self._wait_until_loaded(timeout_s)
        return self
