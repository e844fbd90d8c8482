"""Ctrl-C or SIGTERM stops `kmq demo` at any phase: nothing new starts (no phase line after the
signal), it exits 130 (Ctrl-C) or 143 (SIGTERM), and every process it started (the broker,
Spark's JVM and its Python workers) has ended when it exits."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.kafka_helpers import wait_for
from tests.processes import descendants, kmq_argv

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

#: What the demo may take to print a phase line on a loaded 2-core machine (Spark's start and
#: its first batch of 2,000 orders took 240 s there with the suite and two busy loops beside).
PHASE_WAIT_S = 420
#: From the signal to the exit: the JVM gets 15 s to end, the tracker 30 s to leave its group.
EXIT_WAIT_S = 120
#: The lines that tell a phase began; none may come after the signal.
PHASE_LINES = ("embedded broker on", "produced ", "starting Spark", "batch ")


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot), ``None`` if it is gone or a zombie: with
    its PID it names one process, never another that got the PID later."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


@dataclass
class Demo:
    process: subprocess.Popen[bytes]
    log: Path
    #: Every descendant seen: PID -> start time.
    seen: dict[int, int] = field(default_factory=dict)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def note_descendants(self) -> None:
        for pid in descendants(self.process.pid):
            started = start_time(pid)
            if started is not None:
                self.seen.setdefault(pid, started)

    def still_running(self) -> list[int]:
        return [pid for pid, started in self.seen.items() if start_time(pid) == started]


@contextlib.contextmanager
def running_demo(tmp_path: Path) -> Iterator[Demo]:
    """`kmq demo` in its own session; the PIDs of its descendants are noted ten times a second
    while it runs (Spark's JVM may start after the signal), and whatever ends the test, every
    one of them still there is killed."""
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            kmq_argv("demo", "--output-dir", str(tmp_path / "out")),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "HOME": str(tmp_path)}, start_new_session=True,
        )  # fmt: skip
    demo = Demo(process, log)
    running = threading.Event()
    running.set()

    def note_descendants() -> None:
        while running.is_set() and process.poll() is None:
            demo.note_descendants()
            time.sleep(0.1)

    sampler = threading.Thread(target=note_descendants, daemon=True)
    sampler.start()
    try:
        yield demo
    finally:
        running.clear()
        sampler.join(10)
        if process.poll() is None:
            demo.note_descendants()
            process.kill()
        for pid in demo.still_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(30)


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
    with running_demo(tmp_path) as demo:
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
        left = {pid: _command(pid) for pid in demo.still_running()}
        assert not left, left


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:200].decode(errors="replace")
    return "?"
