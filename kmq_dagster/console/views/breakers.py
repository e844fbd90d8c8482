"""Breakers & alerts: every shared circuit breaker's state and since when, its transitions,
and the alerts raised."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kmq_dagster.console import queries, session
from kmq_dagster.console.overview_format import alert_rows, breaker_rows, transition_rows

#: Alerts listed, newest first (a table that wraps long texts grows with each).
ALERTS_SHOWN = 50


def show() -> None:
    store = session.store()
    states = queries.breakers(store)
    _section(
        "Circuit breakers",
        breaker_rows(states),
        "No circuit breaker has been used (kmq worker --breaker).",
    )
    _section(
        "Transitions",
        transition_rows(queries.recent_transitions(store)),
        "No transitions recorded.",
    )
    _section(
        "Alerts",
        alert_rows(queries.recent_alerts(store, limit=ALERTS_SHOWN)),
        "No alerts raised.",
        wrap=True,
    )


def _section(
    title: str, rows: list[dict[str, object]], when_empty: str, *, wrap: bool = False
) -> None:
    """A titled table of ``rows``, or the ``when_empty`` line when there are none; ``wrap``
    shows long texts whole, wrapped (a static table), instead of cut to the column."""
    st.subheader(title)
    if not rows:
        st.text(when_empty)
    elif wrap:
        st.table(pd.DataFrame(rows), hide_index=True)
    else:
        st.dataframe(pd.DataFrame(rows), hide_index=True)


session.principal()
st.title("Breakers & alerts")
st.fragment(run_every=session.config().refresh_s)(show)()
