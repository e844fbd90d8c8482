"""Ctrl-C or SIGTERM stops `kmq demo` at any phase: nothing new starts (no phase line after the
signal), it exits 130 (Ctrl-C) or 143 (SIGTERM), and every process it started (the broker,
Spark's JVM and its Python workers) has ended when it exits."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.e2e.process_tree import running_kmq
from tests.kafka_helpers import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

#: What the demo may take to print a phase line on a loaded 2-core machine (Spark's start and
#: its first batch of 2,000 orders took 240 s there with the suite and two busy loops beside).
PHASE_WAIT_S = 420
#: From the signal to the exit: the JVM gets 15 s to end, the tracker 30 s to leave its group.
EXIT_WAIT_S = 120
#: The lines that tell a phase began; none may come after the signal.
PHASE_LINES = ("embedded broker on", "produced ", "starting Spark", "batch ")


@pytest.mark.timeout(PHASE_WAIT_S + EXIT_WAIT_S + 60)
@pytest.mark.parametrize(
    ("phase", "signum", "code"),
    [
        ("starting Spark", signal.SIGINT, 130),  # the JVM is starting
        ("starting Spark", signal.SIGTERM, 143),
        ("batch 1:", signal.SIGINT, 130),  # batches are running
    ],
    ids=["ctrl-c-while-spark-starts", "sigterm-while-spark-starts", "ctrl-c-while-batches-run"],
)
def test_a_stopped_demo_starts_nothing_more_and_leaves_nothing_running(
    tmp_path: Path, phase: str, signum: signal.Signals, code: int
) -> None:
    with running_kmq("demo", log=tmp_path / "demo.log", env={"HOME": str(tmp_path)}) as demo:
        assert wait_for(lambda: phase in demo.text() or demo.process.poll() is not None,
                        timeout_s=PHASE_WAIT_S), demo.text()[-3000:]  # fmt: skip
        assert demo.process.poll() is None, demo.text()[-3000:]
        told = len(demo.log.read_bytes())
        if signum == signal.SIGINT:
            os.killpg(demo.process.pid, signum)  # as a terminal's Ctrl-C: the whole group
        else:
            demo.process.send_signal(signum)  # as `kill` or a service manager: the process

        assert demo.process.wait(timeout=EXIT_WAIT_S) == code, demo.text()[-3000:]
        after = demo.log.read_bytes()[told:].decode(errors="replace")
        for line in PHASE_LINES:
            assert line not in after, after
        assert "kmq demo: stopped by" in after and "Traceback" not in after, after
        assert demo.seen, "no process of the demo was seen"
        assert not demo.still_running()
