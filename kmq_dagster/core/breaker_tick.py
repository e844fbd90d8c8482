"""The breaker sensor's decisions, as pure functions: what it remembers between ticks, the
window of samples it judges, and the message a tick leaves.

The sensor (:mod:`kmq_dagster.defs.breaker`) measures the queue, reads and writes the stored
breaker and sends alerts; everything it decides from those readings is here, so it is tested
without Dagster, a broker or a store.

Examples:
    >>> memory = SensorMemory.from_cursor(None)
    >>> memory.add_measurement({"at_ms": 0, "produced": 10, "consumed": 0, "inflight": 0,
    ...                         "failures": 0}, at_ms=0, window_ms=30_000)
    []
    >>> memory.add_measurement({"at_ms": 5_000, "produced": 10, "consumed": 8, "inflight": 0,
    ...                         "failures": 2}, at_ms=5_000, window_ms=30_000)
    [Sample(at_ms=5000, processed=8, failures=2)]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.core.breaker import BreakerConfig, Sample, State
from kmq_dagster.core.breaker_alerts import AlertState
from kmq_dagster.core.breaker_reports import describe_quiet_tick
from kmq_dagster.core.breaker_samples import Unsettled, settle
from kmq_dagster.core.status import TOTALS, progress_between

#: Transitions a tick's message names one by one; earlier ones are counted.
SAID_TRANSITIONS = 3
#: How many windows of samples the sensor keeps (the breaker judges one).
KEPT_WINDOWS = 2


@dataclass
class SensorMemory:
    """What the breaker sensor carries from one tick to the next, in its Dagster cursor."""

    #: The queue's totals at the last tick (:meth:`QueueStatus.totals`); ``None`` before the
    #: first, which only sets the baseline.
    totals: dict[str, int] | None = None
    samples: list[Sample] = field(default_factory=list)
    unsettled: Unsettled = field(default_factory=Unsettled)
    alerts: AlertState = field(default_factory=AlertState)
    #: The newest stored transition a tick has reported already.
    last_transition_id: int = 0

    @classmethod
    def from_cursor(cls, cursor: str | None) -> SensorMemory:
        """The memory a cursor holds; an empty cursor (a new sensor, a reset) is a fresh one."""
        stored: dict[str, Any] = json.loads(cursor) if cursor else {}
        alerts = AlertState(**stored.get("alerts", {}))
        return cls(
            totals=stored.get("totals"),
            samples=[Sample(*s) for s in stored.get("samples", [])],
            unsettled=Unsettled(*stored.get("unsettled", ())),
            alerts=alerts,
            last_transition_id=int(stored.get("last_transition_id", alerts.last_transition_id)),
        )

    def to_cursor(self) -> str:
        return json.dumps(
            {
                "totals": self.totals,
                "samples": [[s.at_ms, s.processed, s.failures] for s in self.samples],
                "unsettled": [self.unsettled.finished, self.unsettled.failures],
                "alerts": vars(self.alerts),
                "last_transition_id": self.last_transition_id,
            }
        )

    def add_measurement(
        self, totals: Mapping[str, int], *, at_ms: int, window_ms: int
    ) -> list[Sample]:
        """Add what the group did since the last tick as a sample (none on the first tick),
        forget samples older than :data:`KEPT_WINDOWS` windows, remember ``totals``; returns
        the samples kept."""
        if self.totals is not None:
            finished, failures = progress_between(self.totals, totals)
            sample, self.unsettled = settle(at_ms, finished, failures, self.unsettled)
            self.samples.append(sample)
        self.samples = [s for s in self.samples if s.at_ms > at_ms - KEPT_WINDOWS * window_ms]
        self.totals = {name: totals[name] for name in TOTALS}
        return list(self.samples)


def quiet_tick(
    state: State,
    samples: Sequence[Sample],
    config: BreakerConfig,
    now_ms: int,
    *,
    opened_at_ms: int | None,
    cooldown_ms: int | None,
) -> str:
    """What a tick that moved nothing saw, over the window the breaker judges."""
    counted = [s for s in samples if s.at_ms > now_ms - config.window_ms]
    failures = sum(s.failures for s in counted)
    messages = max(0, sum(s.processed for s in counted), failures)
    return describe_quiet_tick(
        state,
        failures=failures,
        messages=messages,
        window_ms=config.window_ms,
        opened_at_ms=opened_at_ms,
        cooldown_ms=cooldown_ms,
        now_ms=now_ms,
    )


def tick_lines(transitions: Sequence[str], quiet: str) -> list[str]:
    """A tick's message, line by line: the transitions it reports (the last
    :data:`SAID_TRANSITIONS` of them, earlier ones counted: a new cursor sees the whole
    history as new), or what it saw when nothing moved."""
    if not transitions:
        return [quiet]
    if len(transitions) <= SAID_TRANSITIONS:
        return list(transitions)
    earlier = len(transitions) - SAID_TRANSITIONS
    return [f"{earlier} earlier transitions", *transitions[-SAID_TRANSITIONS:]]
