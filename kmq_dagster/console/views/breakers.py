"""Breakers & alerts: every shared circuit breaker's state and since when, its transitions,
and the alerts raised."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from kmq_dagster.console import queries, session


def show() -> None:
    store = session.store()
    st.subheader("Circuit breakers")
    states = queries.breakers(store)
    if states:
        st.dataframe(
            pd.DataFrame(
                [{"queue": s.queue_topic, "group": s.group_id, "state": s.state,
                  "since": since, "opened at": _from_ms(s.opened_at_ms) if s.opened_at_ms else None,
                  "cooldown (s)": s.cooldown_ms / 1000} for s, since in states]
            ),
            hide_index=True,
        )  # fmt: skip
    else:
        st.text("No circuit breaker has been used (kmq worker --breaker).")
    st.subheader("Transitions")
    transitions = queries.recent_transitions(store)
    if transitions:
        st.dataframe(
            pd.DataFrame(
                [{"at": t.at, "queue": t.queue_topic, "group": t.group_id, "from": t.from_state,
                  "to": t.to_state, "error rate": t.error_rate, "calls": t.window_calls,
                  "reason": t.reason} for t in transitions]
            ),
            hide_index=True,
        )  # fmt: skip
    else:
        st.text("No transitions recorded.")
    st.subheader("Alerts")
    alerts = queries.recent_alerts(store)
    if alerts:
        st.dataframe(
            pd.DataFrame(
                [{"at": a.at, "severity": a.severity, "queue": a.queue_topic,
                  "group": a.group_id, "message": a.message} for a in alerts]
            ),
            hide_index=True,
        )  # fmt: skip
    else:
        st.text("No alerts raised.")


def _from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


session.principal()
st.title("Breakers & alerts")
st.fragment(run_every=session.config().refresh_s)(show)()
