"""PostgreSQL stopped under `kmq ingest` and a breaker-enabled worker (CI size)."""

from __future__ import annotations

import pytest

from kmq_dagster.bench.audit_outage import audit_store_down

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.slow]


def test_an_audit_store_outage_loses_nothing_and_stores_each_dead_letter_once() -> None:
    # given a worker whose breaker lives in PostgreSQL and an ingester copying the DLQ there;
    # when PostgreSQL is stopped for 8 s mid-stream and started again
    figures = audit_store_down(print, messages=2_000, down_s=8.0, timeout_s=240)
    print(figures)
    # then both rode through (audit_store_down raises if either exited), nothing was lost, and
    # the store holds every dead letter of the DLQ exactly once
    assert figures["lost"] == 0
    assert figures["dead_lettered"] > 0
    assert figures["missing_rows"] == 0
    assert figures["duplicate_rows"] == 0
    assert figures["dead_letter_rows"] >= figures["dead_lettered"]
