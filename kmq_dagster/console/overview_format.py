"""The Overview's and the Breakers page's tables and charts as data, formatted for a person on
call: rates like ``3.8 /s``, ages like ``1m 12s`` (``-`` when nothing is in flight), error
rates as percentages, and dead-letter arrivals bucketed to fit the chosen window, every bucket
drawn (0 when empty) so the bars spread over the window instead of one bar at an hour's start.

Pure functions of rows and times (no Streamlit, no clock reads): the pages pass ``now`` in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd

from kmq_dagster.audit.models import Alert, BreakerState, BreakerTransition
from kmq_dagster.console.queries import QueueSummary
from kmq_dagster.core.readable import (
    NOTHING,
    arrival_bucket_s,
    bucket_starts_s,
    duration_text,
    percent_text,
    rate_text,
    state_text,
)

#: Chart windows the Overview offers: label -> length.
WINDOWS = {
    "last hour": timedelta(hours=1),  # the default: a day's buckets squeeze a burst to a sliver
    "last 24 hours": timedelta(hours=24),
    "last 7 days": timedelta(days=7),
}


def time_text(moment: datetime | None) -> str:
    """A stored time as a person reads it (UTC, to the second); :data:`NOTHING` if none."""
    if moment is None:
        return NOTHING
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return f"{aware.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def count_text(count: int | None) -> str:
    """A count with thousands separators; :data:`NOTHING` if not measured (no snapshot)."""
    return NOTHING if count is None else f"{count:,}"


def age_text(moment: datetime | None, now: datetime) -> str:
    """How long ago ``moment`` was (``"12s"``); :data:`NOTHING` if never."""
    if moment is None:
        return NOTHING
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return duration_text(max(0.0, (now - aware).total_seconds() * 1000))


def breaker_text(state: str | None, since: datetime | None, now: datetime) -> str:
    """A breaker's state and for how long: ``"open for 1m 12s"``; :data:`NOTHING` if the group
    never used one."""
    if state is None:
        return NOTHING
    shown = state_text(state)
    return shown if since is None else f"{shown} for {age_text(since, now)}"


def summary_row(summary: QueueSummary, now: datetime) -> dict[str, object]:
    """One queue and group as the Overview's table shows it, ages relative to ``now`` (a
    snapshot many seconds old means the observation sensor is not running)."""
    snapshot = summary.snapshot
    counts = summary.dead_letters
    return {
        "queue": summary.queue_topic,
        "group": summary.group_id,
        # the on-call's first question, so right after the names and never cut
        "breaker": breaker_text(summary.breaker_state, summary.breaker_since, now),
        "dead letters": dead_letters_text(counts),
        "lag": count_text(snapshot.lag if snapshot else None),
        "in flight": count_text(snapshot.inflight if snapshot else None),
        "oldest unacked": duration_text(snapshot.oldest_unacked_age_ms if snapshot else None),
        "in": rate_text(snapshot.in_rate if snapshot else None),
        "acked": rate_text(snapshot.ack_rate if snapshot else None),
        "snapshot age": age_text(snapshot.at if snapshot else None, now),
    }


def dead_letters_text(counts: dict[str, int]) -> str:
    """A queue's dead letters by status in words: ``"15 new, 3 replayed"`` (statuses with
    none left out); ``"none"`` when it has none."""
    parts = [f"{counts[s]:,} {s}" for s in ("new", "replayed", "discarded") if counts.get(s)]
    return ", ".join(parts) or "none"


def arrival_frame(
    arrivals: Sequence[dict[str, Any]], since: datetime, now: datetime, bucket_s: int
) -> pd.DataFrame:
    """Dead letters per bucket (rows: every bucket start from ``since`` to ``now``, in UTC;
    columns: queues), from :func:`~kmq_dagster.console.queries.arrivals` rows of the same
    ``bucket_s``. Empty buckets are 0, so the chart spans the window."""
    starts = [
        datetime.fromtimestamp(start, UTC)
        for start in bucket_starts_s(int(since.timestamp()), int(now.timestamp()), bucket_s)
    ]
    frame = pd.DataFrame(list(arrivals), columns=["at", "queue", "dead letters"])
    table = frame.pivot_table(index="at", columns="queue", values="dead letters", aggfunc="sum")
    table = table.reindex(pd.DatetimeIndex(starts, name="at"), fill_value=0).fillna(0)
    return table.astype(int)


def window_bucket_s(window: timedelta) -> int:
    """The arrivals chart's bucket for a window (1 hour: minutes, 7 days: hours)."""
    return arrival_bucket_s(int(window.total_seconds()))


def breaker_rows(states: Sequence[tuple[BreakerState, datetime | None]]) -> list[dict[str, Any]]:
    """The Breakers page's table of shared breakers."""
    return [
        {
            "queue": state.queue_topic,
            "group": state.group_id,
            "state": state_text(state.state),
            "since": time_text(since),
            # a closed breaker is not open: its last opening is in the transitions below
            "opened at": time_text(
                datetime.fromtimestamp(state.opened_at_ms / 1000, UTC)
                if state.opened_at_ms and state.state != "closed"
                else None
            ),
            "cooldown": duration_text(state.cooldown_ms),
        }
        for state, since in states
    ]


def transition_rows(transitions: Sequence[BreakerTransition]) -> list[dict[str, Any]]:
    """The Breakers page's transitions: the error rate as the percentage the reason says."""
    return [
        {
            "at": time_text(t.at),
            "queue": f"{t.queue_topic} / {t.group_id}",
            "from": state_text(t.from_state),
            "to": state_text(t.to_state),
            "error rate": percent_text(t.error_rate) if t.window_calls else NOTHING,
            "messages judged": t.window_calls,
            "reason": t.reason,
        }
        for t in transitions
    ]


def alert_rows(alerts: Sequence[Alert]) -> list[dict[str, Any]]:
    """Alerts for a table that wraps long texts (``st.table``): the whole message, never cut."""
    return [
        {
            "at": time_text(a.at),
            "severity": a.severity,
            "queue": f"{a.queue_topic} / {a.group_id}",
            "message": _STATE_NAME.sub(lambda m: state_text(m.group()), a.message),
        }
        for a in alerts
    ]


#: A breaker state as the code spells it, in alerts stored before they used
#: :func:`~kmq_dagster.core.readable.state_text` (or written by older versions).
_STATE_NAME = re.compile(r"\bhalf_open\b")
