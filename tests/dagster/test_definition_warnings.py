"""Loading kmq's definitions raises no warning of our own making: no beta or preview parameter
of Dagster's reached from our code (the keep-alive sensor's ``owners`` BetaWarning was one), no
warning raised in kmq_dagster. Each load runs in a fresh interpreter, so warnings raised once per
process at import time are seen too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.dg_project import run_dg

ROOT = Path(__file__).resolve().parents[2]

#: Loads the demo definitions (workspace.yaml's) as Dagster does (the repository is
#: built, resources bound to jobs, sensors copied), recording every warning, printed as JSON.
LOAD_RECORDING_WARNINGS = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from dagster import Definitions
    from kmq_dagster.definitions import defs
    repository = defs.get_repository_def()
    Definitions.validate_loadable(defs)
    for sensor in repository.sensor_defs:
        sensor.targets  # what the UI and the daemon read
print(json.dumps([
    {"category": f"{w.category.__module__}.{w.category.__name__}", "file": w.filename,
     "message": str(w.message)}
    for w in caught
]))
"""


def _environment(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DAGSTER_HOME": str(tmp_path),
        "KMQ_DEMO_OUTPUT": str(tmp_path / "out.parquet"),
    }


def ours(warning: dict[str, str]) -> bool:
    """A warning we caused: any Dagster warning (beta, preview, superseded, deprecated), or
    anything raised from a file of kmq_dagster."""
    return warning["category"].startswith("dagster") or "kmq_dagster" in warning["file"]


def test_loading_the_definitions_warns_about_nothing_of_ours(tmp_path: Path) -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_RECORDING_WARNINGS],
        env=_environment(tmp_path), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip

    caught = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert [w for w in caught if ours(w)] == []


@pytest.mark.parametrize("command", [("list", "components"), ("check", "defs")])
def test_dg_commands_print_no_warning(command: tuple[str, ...]) -> None:
    """``dg`` in the example project, a fresh interpreter each: nothing reaches the user as a
    warning (dagster-spark's preview ``SparkDeclarativePipelineScaffolder``, which ``dg``
    instantiated for every command, is silenced where kmq imports dagster-pyspark)."""
    result = run_dg(*command)

    assert result.returncode == 0, result.stdout
    warned = [line for line in result.stdout.splitlines() if "Warning:" in line]
    assert warned == [], result.stdout
