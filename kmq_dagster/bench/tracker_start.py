"""``kmq bench tracker``: how soon a ``kmq tracker`` process is ready, and how long it takes
to stop.

Each round provisions a fresh 4-partition queue and runs real ``kmq tracker`` processes on it:

* ``first``: the first tracker of the group, from process start to its log line saying its
  last markers partition was read to its end (it found the group empty, so it did not wait
  for the group join); then stopped with SIGTERM at once (``stop_early_s``: its stop waits for
  the group to form, so it can commit);
* ``restart``: the same again after that clean stop (the group is empty again);
* ``second``: a tracker started beside a running one, from process start to its log line
  saying the group gave it its share (a member is there, so it waits for the join).

Times are medians over the rounds, in seconds.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kmq_dagster.bench.common import Report
from kmq_dagster.bench.fleet import Fleet, KmqProcess
from kmq_dagster.core.queue import Queue
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.settings import KmqSettings

PARTITIONS = 4
#: Longest one tracker gets to reach the line a measurement waits for.
READY_TIMEOUT_S = 120.0
_CAUGHT_UP = "caught up at"
_SHARE = "(the group's share)"


class BenchFailure(RuntimeError):
    """A tracker did not get ready in time; the message has its last log lines."""


@dataclass
class TrackerStartFigures:
    first_ready_s: list[float] = field(default_factory=list)
    stop_early_s: list[float] = field(default_factory=list)
    restart_ready_s: list[float] = field(default_factory=list)
    second_share_s: list[float] = field(default_factory=list)

    def as_json(self) -> str:
        def median(values: list[float]) -> float:
            return round(statistics.median(values), 2)

        return json.dumps(
            {
                "tracker_ready_s": median(self.first_ready_s),
                "tracker_restart_ready_s": median(self.restart_ready_s),
                "tracker_stop_early_s": median(self.stop_early_s),
                "second_tracker_share_s": median(self.second_share_s),
                "rounds": {
                    "ready_s": self.first_ready_s,
                    "restart_ready_s": self.restart_ready_s,
                    "stop_early_s": self.stop_early_s,
                    "second_share_s": self.second_share_s,
                },
            }
        )


def run_tracker_start_benchmark(
    settings: KmqSettings, report: Report, *, rounds: int
) -> TrackerStartFigures:
    """Start, stop and restart ``kmq tracker`` processes on ``settings``' cluster."""
    figures = TrackerStartFigures()
    with tempfile.TemporaryDirectory(prefix="kmq-bench-tracker-") as scratch:
        fleet = Fleet(Path(scratch), _child_env(settings))
        try:
            for round_number in range(1, rounds + 1):
                _round(settings, fleet, figures)
                report(
                    f"round {round_number}/{rounds}: ready in {figures.first_ready_s[-1]:.2f} s "
                    f"(stopped in {figures.stop_early_s[-1]:.2f} s), restarted ready in "
                    f"{figures.restart_ready_s[-1]:.2f} s, a second tracker's share in "
                    f"{figures.second_share_s[-1]:.2f} s"
                )
        finally:
            fleet.stop_all()
    return figures


def _round(settings: KmqSettings, fleet: Fleet, figures: TrackerStartFigures) -> None:
    queue = Queue(f"bench-tracker-{uuid.uuid4().hex[:8]}", "bench", partitions=PARTITIONS)
    provision_queue(settings, queue)
    args = ("tracker", "--topic", queue.topic, "--group", queue.group)

    started = time.monotonic()
    first = fleet.start("tracker", *args)
    figures.first_ready_s.append(_until_lines(first, _CAUGHT_UP, PARTITIONS) - started)
    stopping = time.monotonic()
    first.stop()
    figures.stop_early_s.append(time.monotonic() - stopping)

    started = time.monotonic()
    running = fleet.start("tracker", *args)
    figures.restart_ready_s.append(_until_lines(running, _CAUGHT_UP, PARTITIONS) - started)

    _until_lines(running, _SHARE, 1)  # the group has formed, with it as its member
    started = time.monotonic()
    second = fleet.start("tracker", *args)
    figures.second_share_s.append(_until_lines(second, _SHARE, 1) - started)
    second.stop()
    running.stop()


def _until_lines(process: KmqProcess, text: str, count: int) -> float:
    """The time ``process``'s log first held ``count`` lines with ``text``."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        lines = process.log_path.read_text(errors="replace").splitlines()
        if sum(text in line for line in lines) >= count:
            return time.monotonic()
        if not process.alive():
            break
        time.sleep(0.01)
    raise BenchFailure(
        f"kmq tracker (pid {process.pid}) logged {count} x {text!r} neither in "
        f"{READY_TIMEOUT_S:.0f} s nor before it exited:\n{process.log_tail()}"
    )


def _child_env(settings: KmqSettings) -> dict[str, str]:
    """The environment that gives a ``kmq`` process ``settings``' cluster and client settings
    (never on its command line, where ``ps`` would show a password)."""
    env = {
        "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KMQ_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms),
    }
    for key, value in settings.client_config.items():
        env[f"KMQ_KAFKA_{key.upper().replace('.', '_')}"] = str(value)
    return env
