"""`kmq bench audit` runs end to end on a fresh broker and a throwaway PostgreSQL."""

from __future__ import annotations

import json

import pytest

from tests.kafka_helpers import LONGEST_WAIT_S
from tests.processes import run_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.slow]


def test_bench_audit_prints_both_ingest_rates() -> None:
    result = run_kmq("bench", "audit", "--rows", "500", "--rounds", "1", timeout_s=LONGEST_WAIT_S)

    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["rows"] == 500
    assert figures["sqlite_rows_per_s"] > 0 and figures["postgres_rows_per_s"] > 0
    assert "round 1/1: SQLite" in result.stderr
