"""The kill storm: workers and trackers SIGKILLed and restarted at random, under load.

``workers`` workers and ``trackers`` trackers share a queue of ``partitions`` partitions while
messages arrive steadily; every ``every_s`` seconds for ``storm_s`` seconds one of them, drawn
at random, is SIGKILLed and a new one started in its place. Then the storm stops and the
queue drains: every message must be processed or dead-lettered; duplicates are counted.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from kmq_dagster.bench.common import Report
from kmq_dagster.bench.fault_setup import Scenario, ScenarioError, Workload, progress_reporter
from kmq_dagster.bench.tally import Ledger

#: Share of the storm during which messages are still being sent.
SEND_SHARE = 0.75


def storm_workload(messages: int, partitions: int) -> Workload:
    # A message may be on a killed worker several times: its redeliveries are not its fault.
    return Workload(
        messages=messages,
        partitions=partitions,
        failure_rate=0.01,
        work_ms=0.2,
        visibility_timeout_ms=10_000,
        max_redeliveries=10,
    )


def kill_storm(
    report: Report,
    *,
    messages: int = 200_000,
    partitions: int = 16,
    workers: int = 8,
    trackers: int = 2,
    storm_s: float = 120.0,
    every_s: float = 5.0,
    timeout_s: float = 900,
    seed: int = 11,
) -> dict[str, Any]:
    """Run the storm; returns the figures (with ``kills``, how many processes were killed)."""
    rng = random.Random(seed)
    with Scenario("storm", storm_workload(messages, partitions), report) as scenario:
        crew = [scenario.worker() for _ in range(workers)]
        crew += [scenario.tracker() for _ in range(trackers)]
        ledgers: list[Ledger] = []
        sender = threading.Thread(
            target=lambda: ledgers.append(scenario.send(spread_s=storm_s * SEND_SHARE)),
            name="storm-sender",
            daemon=True,
        )
        began = time.monotonic()
        sender.start()
        kills = 0
        storm_ends = began + storm_s
        while time.monotonic() + every_s <= storm_ends:
            time.sleep(every_s)  # the storm's own pace, not a wait for a condition
            scenario.require_alive(crew)
            index = rng.randrange(len(crew))
            victim = crew[index]
            victim.kill()
            crew[index] = scenario.fleet.restart(victim)
            kills += 1
            if kills % 4 == 0:
                report(f"storm: {kills} processes killed and restarted")
        sender.join(timeout=max(0.0, storm_ends - time.monotonic()) + 120)
        if not ledgers:
            raise ScenarioError("storm: sending the messages did not finish")
        report(f"storm over after {kills} kills; draining")
        ledgers[0].wait_until_accounted(timeout_s, progress_reporter(report, "storm"))
        seconds = time.monotonic() - began
        scenario.require_alive(crew)
        figures = ledgers[0].outcome(seconds).figures()
        figures.update(kills=kills, workers=workers, trackers=trackers, partitions=partitions)
        return figures
