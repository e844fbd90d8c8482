"""`kmq bench spark` runs the worker, Spark with kmq and plain Spark on one fresh broker and
prints their throughputs, the ratios, where the Spark path's time went and the CPU each path
needed from every process."""

from __future__ import annotations

import json

import pytest

from tests.kafka_helpers import LONGEST_WAIT_S
from tests.processes import run_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]


def test_bench_spark_prints_the_throughputs_their_ratios_and_a_breakdown() -> None:
    result = run_kmq(
        "bench", "spark", "--messages", "4000", "--rounds", "1", timeout_s=LONGEST_WAIT_S
    )

    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert (figures["messages"], figures["rounds"]) == (4000, 1)
    spark = figures["spark_msgs_per_s"]
    assert spark > 0 and figures["worker_msgs_per_s"] > 0
    assert figures["ratio"] == pytest.approx(spark / figures["worker_msgs_per_s"], abs=0.001)
    plain = figures["plain_spark_msgs_per_s"]
    assert figures["ratio_vs_plain_spark"] == pytest.approx(spark / plain, abs=0.001)
    from_kafka = figures["plain_spark_from_kafka_msgs_per_s"]
    assert figures["ratio_vs_plain_spark_from_kafka"] == pytest.approx(
        spark / from_kafka, abs=0.001
    )
    assert figures["plain_spark_dataframe_msgs_per_s"] > 0
    breakdown = figures["breakdown_ms"]
    for phase in ("read", "start_markers", "function", "write", "commit", "ack", "offsets"):
        assert breakdown[phase] >= 0, phase
    assert breakdown["read"] > 0 and breakdown["function"] > 0 and breakdown["job"] > 0
    assert "where the Spark path's time went" in result.stderr
    # Every process of the run counted, the embedded broker recognised as such.
    cpu = figures["cpu_s_per_million"]
    assert set(cpu) == {"spark", "plain_spark", "plain_spark_from_kafka", "plain_spark_dataframe"}
    assert {"broker", "jvm", "python", "total"} <= set(cpu["spark"])
    assert cpu["spark"]["total"] > 0 and cpu["spark"]["jvm"] > 0
    assert "CPU seconds per million messages" in result.stderr
