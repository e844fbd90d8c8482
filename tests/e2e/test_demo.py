"""`kmq demo` from nothing to its summary: poison dead-lettered, transient failures retried,
nothing lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kafka_helpers import LONGEST_WAIT_S
from tests.processes import run_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]


def test_kmq_demo_drains_the_stream_and_loses_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = run_kmq(
        "demo", "--orders", "400", "--output-dir", str(tmp_path), timeout_s=LONGEST_WAIT_S,
        env={"HOME": str(home)},
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    lines = {
        parts[0]: parts[1]
        for parts in (line.split() for line in result.stdout.splitlines())
        if len(parts) == 2
    }
    assert lines["produced"] == "400"
    assert lines["processed"] == "380"  # every order but the 20 poison ones
    assert lines["dead-lettered"] == "20"
    assert lines["retried"] == "20"  # the flaky ones, once each
    assert lines["lost"] == "0"
    assert lines["output"] == str(tmp_path / "orders_priced.parquet")
    assert any((tmp_path / "orders_priced.parquet").glob("*.parquet"))
    assert "produced 400 orders" in result.stderr and "batch " in result.stderr
    # progress for people only: the components' and Spark's logs went to the log file
    for noise in (" INFO ", " WARN", "Warning", "log level", "incubator"):
        assert noise not in result.stderr, result.stderr
    log = (home / ".kmq" / "logs" / "demo.log").read_text()
    assert "lease of pricing got" in log and "Setting default log level" in log
