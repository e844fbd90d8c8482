"""`kmq bench console` runs end to end on SQLite and the session's PostgreSQL server."""

from __future__ import annotations

import json

import pytest

from tests.processes import run_kmq

pytestmark = pytest.mark.postgres


def test_bench_console_prints_page_counts_and_detail_times_for_both_backends(
    postgres_url: str,
) -> None:
    result = run_kmq("bench", "console", "--dead-letters", "2000", "--runs", "1",
                     "--postgres-url", postgres_url, timeout_s=300)  # fmt: skip

    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["dead_letters"] == 2000
    for backend in ("sqlite", "postgres"):
        assert set(figures[backend]) == {"page_ms", "counts_ms", "detail_ms"}
        assert all(ms > 0 for ms in figures[backend].values())
    assert "page, key (1 row):" in result.stderr and "(1 rows)" in result.stderr
    assert "page, + header trace-id (1 row):" in result.stderr
    timed_pages = [line for line in result.stderr.splitlines() if line.strip().startswith("page,")]
    assert len(timed_pages) == 2 * 12 and not [line for line in timed_pages if "(0 rows)" in line]
