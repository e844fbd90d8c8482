"""`kmq bench retry` runs end to end and nothing is processed before its due time."""

from __future__ import annotations

import json

import pytest

from tests.kafka_helpers import LONGEST_WAIT_S
from tests.processes import run_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_bench_retry_prints_its_figures_and_nothing_was_early() -> None:
    args = ("bench", "retry", "--messages", "300", "--send-seconds", "2", "--max-delay", "4s")

    result = run_kmq(*args, timeout_s=LONGEST_WAIT_S)

    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"early", "lateness_p50_ms", "lateness_p99_ms"} <= set(figures)
    assert figures["early"] == 0
    assert figures["deliveries"] == 300 + 300 + 100  # delayed, first retries, second retries
    assert "due deliveries processed" in result.stderr
