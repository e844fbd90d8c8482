"""Many messages in flight at once: the tracker's memory stays bounded and it redelivers all."""

from __future__ import annotations

import pytest

from kmq_dagster.bench.inflight_scale import million_in_flight

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_a_tracker_with_100k_in_flight_stays_under_100_mb_and_redelivers_each_once() -> None:
    # given 100,000 messages started and never acknowledged, tracked by a kmq tracker process
    figures = million_in_flight(print, messages=100_000, visibility_timeout_ms=8_000)
    print(figures)
    # then its resident memory never passed 100 MB, and each message was redelivered once for
    # each time it was started (on a loaded machine the start can outlast the visibility
    # timeout: a copy redelivered then and started again is redelivered again, rightly)
    assert figures["tracker_rss_peak_mb"] <= 100
    assert figures["lost"] == 0
    assert figures["duplicates"] <= figures["started_again"]
