"""`kmq demo` from nothing to its summary: poison dead-lettered, transient failures retried,
nothing lost; run from a clone, it writes nothing there, only to its private ~/.kmq/demo."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.e2e.process_tree import running_kmq

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

#: What the whole demo may take on a loaded 2-core machine (over 300 s was seen there with the
#: suite and two busy loops beside; 40-60 s when the machine is quiet).
DEMO_WAIT_S = 600


@pytest.mark.timeout(DEMO_WAIT_S + 60)
def test_kmq_demo_drains_the_stream_and_loses_nothing(tmp_path: Path) -> None:
    home, clone = tmp_path / "home", tmp_path / "clone"
    clone.mkdir()
    with running_kmq("demo", "--orders", "400", log=tmp_path / "demo.log", cwd=clone,
                     env={"HOME": str(home)}) as demo:  # fmt: skip
        assert demo.process.wait(timeout=DEMO_WAIT_S) == 0, demo.text()[-3000:]
        output = demo.text()
        assert not demo.still_running()

    lines = {
        parts[0]: parts[1] for parts in (line.split() for line in output.splitlines())
        if len(parts) == 2
    }  # fmt: skip
    assert lines["produced"] == "400"
    assert lines["processed"] == "380"  # every order but the 20 poison ones
    assert lines["dead-lettered"] == "20"
    assert lines["retried"] == "20"  # the flaky ones, once each
    assert lines["lost"] == "0"
    demo_home = home / ".kmq" / "demo"
    assert lines["output"] == str(demo_home / "orders_priced.parquet")
    assert any((demo_home / "orders_priced.parquet").glob("*.parquet"))
    # nothing in the folder it ran from; its own folders private
    assert list(clone.iterdir()) == []
    for folder in (home / ".kmq", demo_home):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert "produced 400 orders" in output and "batch " in output
    # progress for people only: the components' and Spark's logs went to the log file
    for noise in (" INFO ", " WARN", "Warning", "log level", "incubator", "readable by other"):
        assert noise not in output, output
    log = (home / ".kmq" / "logs" / "demo.log").read_text()
    assert "lease of pricing got" in log and "Setting default log level" in log
