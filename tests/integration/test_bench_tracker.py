"""`kmq bench tracker` runs real `kmq tracker` processes end to end and prints its figures."""

from __future__ import annotations

import json

import pytest

from tests.kafka_helpers import LONGEST_WAIT_S
from tests.processes import run_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_bench_tracker_prints_its_figures() -> None:
    result = run_kmq("bench", "tracker", "--rounds", "1", timeout_s=LONGEST_WAIT_S)

    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    medians = ("tracker_ready_s", "tracker_restart_ready_s", "tracker_stop_early_s",
               "second_tracker_share_s")  # fmt: skip
    assert all(figures[name] > 0 for name in medians)
    assert all(len(values) == 1 for values in figures["rounds"].values())
    assert "round 1/1: ready in" in result.stderr
