"""`kmq bench parallel` runs end to end: every figure issue 25 asks for, and every run handled
and acknowledged every message (nothing here is about how fast)."""

from __future__ import annotations

import json

import pytest

from tests.kafka_helpers import LONGEST_WAIT_S
from tests.processes import run_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RUNS = {
    "key": 200,
    "unordered": 200,
    "partition": 200,
    "async_key": 200,
    "async_unordered": 200,
    "async_partition": 200,
    "io": 1000,
    "noop_n1": 1000,
    "noop_n1_direct": 1000,
    "noop_concurrent_loop": 1000,
}


def test_bench_parallel_prints_every_figure_and_handles_every_message_in_every_run() -> None:
    result = run_kmq(
        "bench", "parallel", "--messages", "200", "--keys", "20", "--concurrency", "20",
        "--io-messages", "1000", "--io-concurrency", "200", "--noop-messages", "1000",
        "--rounds", "1", "--rss-backlog", "3000",
        timeout_s=LONGEST_WAIT_S,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert {
        "seconds_key",
        "seconds_unordered",
        "seconds_partition",
        "seconds_async_key",
        "seconds_async_unordered",
        "seconds_async_partition",
        "io_msgs_per_s",
        "noop_n1_msgs_per_s",
        "noop_n1_direct_msgs_per_s",
        "noop_n1_ratio",
        "noop_concurrent_loop_msgs_per_s",
        "rss_start_mb",
        "rss_peak_mb",
        "rss_end_mb",
        "rss_slope_mb_per_min",
        "python_alone_seconds",
        "io_python_alone_msgs_per_s",
    } <= set(figures)
    # every run handled (the handler returned) and acknowledged every message it was given
    assert figures["messages"] == RUNS
    assert figures["handled"] == RUNS
    assert figures["rss_handled"] == figures["rss_backlog"] == 3000
    assert figures["noop_n1_ratio"] == pytest.approx(
        figures["noop_n1_msgs_per_s"] / figures["noop_n1_direct_msgs_per_s"], abs=0.002
    )
    # Python alone on the same waits, the floor each figure is read against
    assert set(figures["python_alone_seconds"]) == {
        "threads_key", "threads_unordered", "asyncio_key", "asyncio_unordered", "asyncio_io"
    }  # fmt: skip
    assert figures["io_python_alone_msgs_per_s"] > 0
    assert "python alone, same waits" in result.stderr
    # and kmq's thread runner alone on them, between that floor and the worker
    assert set(figures["thread_runner_alone_seconds"]) == {"key", "unordered"}
    assert "kmq's thread runner alone, same waits" in result.stderr
    # what each run wrote to the markers topic: at least one end marker, at most one a message
    assert set(figures["end_markers_per_1000_msgs"]) == set(RUNS)
    assert all(0 < per_1000 <= 1000 for per_1000 in figures["end_markers_per_1000_msgs"].values())
    assert "end markers per 1,000 messages: key " in result.stderr
    # the peak is the highest RSS seen, the kernel's high-water mark or a sample above it
    assert 0 < figures["rss_start_mb"] <= figures["rss_peak_mb"]
    assert max(figures["rss_samples_mb"]) <= figures["rss_peak_mb"]
    # the table and the explanation of the N = 1 comparison, on stderr; no INFO logs
    assert "Parallel Consumer" in result.stderr
    assert "the regression at N = 1" in result.stderr
    assert " INFO " not in result.stderr
