"""``kmq bench loop``: the worker loop's CPU per message on an in-memory consumer."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kmq_dagster.bench.loop_cost import RUNS
from kmq_dagster.cli import cli


def test_bench_loop_prints_each_runs_cpu_per_message_as_its_last_json_line() -> None:
    result = CliRunner().invoke(cli, ["bench", "loop", "--messages", "2000", "--rounds", "2"])

    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert set(figures) == {f"loop_{name}_cpu_us_per_msg" for name in RUNS}
    assert all(us > 0 for us in figures.values())
