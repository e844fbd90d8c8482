"""Breakers & alerts: every shared circuit breaker's state and since when, its transitions,
and the alerts raised."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from kmq_dagster.console import queries, session


def show() -> None:
    store = session.store()
    states = queries.breakers(store)
    _section(
        "Circuit breakers",
        [{"queue": s.queue_topic, "group": s.group_id, "state": s.state,
          "since": since, "opened at": _from_ms(s.opened_at_ms) if s.opened_at_ms else None,
          "cooldown (s)": s.cooldown_ms / 1000} for s, since in states],
        "No circuit breaker has been used (kmq worker --breaker).",
    )  # fmt: skip
    _section(
        "Transitions",
        [{"at": t.at, "queue": t.queue_topic, "group": t.group_id, "from": t.from_state,
          "to": t.to_state, "error rate": t.error_rate, "calls": t.window_calls,
          "reason": t.reason} for t in queries.recent_transitions(store)],
        "No transitions recorded.",
    )  # fmt: skip
    _section(
        "Alerts",
        [{"at": a.at, "severity": a.severity, "queue": a.queue_topic,
          "group": a.group_id, "message": a.message} for a in queries.recent_alerts(store)],
        "No alerts raised.",
    )  # fmt: skip


def _section(title: str, rows: list[dict[str, object]], when_empty: str) -> None:
    """A titled table of ``rows``, or the ``when_empty`` line when there are none."""
    st.subheader(title)
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    else:
        st.text(when_empty)


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


session.principal()
st.title("Breakers & alerts")
st.fragment(run_every=session.config().refresh_s)(show)()
