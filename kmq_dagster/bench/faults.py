"""``kmq bench faults``: what holds when the broker crashes or stalls, processes are killed by
the dozen, a million messages are in flight, or the audit store goes away.

Each scenario runs real ``kmq`` processes (broker, workers, trackers, delayer, ingester) that
it starts and stops by PID, and counts what became of every message: lost must be 0 in every
one; duplicates are reported. The last line printed is one JSON object::

    {"scenarios": {name: {"messages", "lost", "duplicates", "seconds", ...}},
     "tracker_rss_mb_at_1m_inflight": N}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.bench.common import Report
from kmq_dagster.errors import KmqError

#: The scenarios, in the order they run.
SCENARIOS = ("broker_crash", "broker_stall", "kill_storm", "million_in_flight", "audit_store_down")


@dataclass(frozen=True)
class FaultSizes:
    """How big each scenario is; the defaults are the issue's full sizes."""

    crash_messages: int = 20_000
    crash_down_s: float = 5.0
    stall_messages: int = 20_000
    stall_s: float = 30.0
    storm_messages: int = 200_000
    storm_partitions: int = 16
    storm_workers: int = 8
    storm_trackers: int = 2
    storm_s: float = 120.0
    storm_every_s: float = 5.0
    inflight_messages: int = 1_000_000
    inflight_visibility_timeout_ms: int = 20_000
    audit_messages: int = 10_000
    audit_down_s: float = 30.0
    #: Longest any scenario may take to account for every message after its fault.
    timeout_s: float = 900.0

    def scaled(self, share: float) -> FaultSizes:
        """The same scenarios with ``share`` of the messages (at least 1,000 each)."""
        import dataclasses

        counts = ("crash_messages", "stall_messages", "storm_messages", "inflight_messages")
        return dataclasses.replace(
            self,
            **{name: max(1_000, int(getattr(self, name) * share)) for name in counts},
            audit_messages=max(1_000, int(self.audit_messages * share)),
        )


@dataclass
class FaultFigures:
    scenarios: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def tracker_rss_mb(self) -> float | None:
        """The tracker's peak RSS in the million-in-flight scenario."""
        inflight = self.scenarios.get("million_in_flight", {})
        peak = inflight.get("tracker_rss_peak_mb")
        return None if peak is None else float(peak)

    def failures(self) -> list[str]:
        """What went wrong: scenarios that lost messages or could not run."""
        problems = []
        for name, figures in self.scenarios.items():
            if "error" in figures:
                problems.append(f"{name}: {figures['error']}")
            elif figures.get("lost"):
                problems.append(f"{name}: {figures['lost']} messages lost")
        return problems

    def as_json(self) -> str:
        return json.dumps(
            {"scenarios": self.scenarios, "tracker_rss_mb_at_1m_inflight": self.tracker_rss_mb}
        )


def _runners(sizes: FaultSizes) -> dict[str, Callable[[Report], dict[str, Any]]]:
    from kmq_dagster.bench.audit_outage import audit_store_down
    from kmq_dagster.bench.broker_faults import broker_crash, broker_stall
    from kmq_dagster.bench.inflight_scale import million_in_flight
    from kmq_dagster.bench.storm import kill_storm

    timeout_s = sizes.timeout_s
    return {
        "broker_crash": lambda report: broker_crash(
            report, messages=sizes.crash_messages, down_s=sizes.crash_down_s, timeout_s=timeout_s
        ),
        "broker_stall": lambda report: broker_stall(
            report, messages=sizes.stall_messages, stall_s=sizes.stall_s, timeout_s=timeout_s
        ),
        "kill_storm": lambda report: kill_storm(
            report,
            messages=sizes.storm_messages,
            partitions=sizes.storm_partitions,
            workers=sizes.storm_workers,
            trackers=sizes.storm_trackers,
            storm_s=sizes.storm_s,
            every_s=sizes.storm_every_s,
            timeout_s=timeout_s,
        ),
        "million_in_flight": lambda report: million_in_flight(
            report,
            messages=sizes.inflight_messages,
            visibility_timeout_ms=sizes.inflight_visibility_timeout_ms,
            timeout_s=timeout_s,
        ),
        "audit_store_down": lambda report: audit_store_down(
            report, messages=sizes.audit_messages, down_s=sizes.audit_down_s, timeout_s=timeout_s
        ),
    }


def run_fault_benchmark(
    sizes: FaultSizes, report: Report, only: Collection[str] | None = None
) -> FaultFigures:
    """Run the scenarios (``only`` those named, if given), one after the other.

    A scenario that cannot run (a process died that should have lived, messages still
    missing at the timeout) is reported with its ``error`` and the next one runs.

    Raises:
        KmqError: ``only`` names an unknown scenario.
    """
    unknown = set(only or ()) - set(SCENARIOS)
    if unknown:
        raise KmqError(
            f"unknown scenario {', '.join(sorted(unknown))}: choose from {', '.join(SCENARIOS)}"
        )
    figures = FaultFigures()
    runners = _runners(sizes)
    for name in SCENARIOS:
        if only and name not in only:
            continue
        report(f"--- {name}")
        try:
            figures.scenarios[name] = runners[name](report)
        except KmqError as exc:
            figures.scenarios[name] = {"error": str(exc).splitlines()[0]}
            report(f"{name} failed: {exc}")
        report(f"{name}: {json.dumps(figures.scenarios[name])}")
    return figures
