"""`kmq bench spark` runs both paths on one fresh broker and prints the ratio."""

from __future__ import annotations

import json

import pytest

from tests.processes import run_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]


def test_bench_spark_prints_both_throughputs_and_their_ratio() -> None:
    result = run_kmq("bench", "spark", "--messages", "4000", timeout_s=600)

    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["messages"] == 4000
    assert figures["spark_msgs_per_s"] > 0 and figures["worker_msgs_per_s"] > 0
    ratio = figures["spark_msgs_per_s"] / figures["worker_msgs_per_s"]
    assert figures["ratio"] == pytest.approx(ratio, abs=0.001)  # printed to 3 decimals
