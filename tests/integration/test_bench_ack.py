"""`kmq bench ack` runs end to end and prints every figure the issue asks for."""

from __future__ import annotations

import json

import pytest

from tests.kafka_helpers import LONGEST_WAIT_S
from tests.processes import run_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


WORKER_RUNS = ("plain_noop", "worker_n1", "worker_n100_sync", "worker_n100_async")


def test_bench_ack_prints_both_throughputs_their_ratio_latency_lateness_and_memory() -> None:
    result = run_kmq(
        "bench",
        "ack",
        "--messages",
        "5000",
        "--worker-messages",
        "5000",
        "--rounds",
        "1",
        "--latency-seconds",
        "3",
        timeout_s=LONGEST_WAIT_S,
    )

    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) == {
        "plain_msgs_per_s",
        "ack_msgs_per_s",
        "ratio",
        "ack_view_msgs_per_s",
        "view_ratio",
        "p95_latency_ms",
        "plain_p95_latency_ms",
        "p95_latency_ratio_vs_plain",
        "plain_same_topics_p95_latency_ms",
        "p95_latency_ratio_vs_plain_same_topics",
        "p50_latency_ms",
        "plain_p50_latency_ms",
        "redelivery_lateness_p99_ms",
        "tracker_bytes_per_inflight",
        "worker_ratio",
        "worker_msgs_per_s",
        "plain_noop_msgs_per_s",
        "worker_n100_sync_msgs_per_s",
        "worker_n100_async_msgs_per_s",
        "worker_messages",
        "worker_handled",
    }
    assert figures["ratio"] == pytest.approx(
        figures["ack_msgs_per_s"] / figures["plain_msgs_per_s"], abs=0.001
    )
    # the latency also as a ratio to a plain consumer's at the same load, in the same run
    # (one round: the median of the rounds' ratios is that round's)
    # (the JSON rounds it to 2 decimals: 0.0842 under load is 0.08)
    assert figures["p95_latency_ratio_vs_plain"] == pytest.approx(
        figures["p95_latency_ms"] / figures["plain_p95_latency_ms"], rel=0.05, abs=0.005
    )
    # and to a plain consumer that also reads kmq's other topics: what reading them costs
    assert figures["p95_latency_ratio_vs_plain_same_topics"] == pytest.approx(
        figures["p95_latency_ms"] / figures["plain_same_topics_p95_latency_ms"],
        rel=0.05,
        abs=0.005,
    )
    # each latency run offered 10,000 msg/s for the 3 s asked (not the default 10)
    assert "offered load of 10,000 msg/s for 3 s" in result.stderr
    assert "latency round 1/1, 30,000 messages a run: p50 / p95 / p99, plain" in result.stderr
    assert "the same reading kmq's topics" in result.stderr
    # every unacknowledged message came back, none before its deadline
    assert "redelivered 2000 after their deadline" in result.stderr
    assert "earliest -" not in result.stderr
    assert 0 < figures["tracker_bytes_per_inflight"] < 100
    # progress lines only: no INFO logs of the consumers and trackers in between
    assert "round 1/1: plain (sync commit)" in result.stderr
    assert " INFO " not in result.stderr
    # 5,000 messages take milliseconds: the bench says its ratio is not the steady one
    assert "the ratio is not the steady one" in result.stderr
    # what users run: the public Worker (N = 1, N = 100 sync and async) and a plain consumer
    # calling a no-op function, each having handled and acknowledged every message
    assert figures["worker_messages"] == 5000
    assert figures["worker_handled"] == dict.fromkeys(WORKER_RUNS, 5000)
    for rate in (
        "plain_noop_msgs_per_s",
        "worker_msgs_per_s",
        "worker_n100_sync_msgs_per_s",
        "worker_n100_async_msgs_per_s",
    ):
        assert figures[rate] > 0, rate
    # one round: the median of the per-round ratios is that round's
    assert figures["worker_ratio"] == pytest.approx(
        figures["worker_msgs_per_s"] / figures["plain_noop_msgs_per_s"], abs=0.002
    )
    assert "worker_n100_async" in result.stderr  # the table line of each run
    assert "worker_ratio (worker_n1 / plain_noop" in result.stderr
