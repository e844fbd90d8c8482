"""Overview: per queue and group, lag, in flight, oldest unacknowledged age, rates, dead
letters by status and breaker state; charts of lag and dead-letter arrivals over a chosen
window; the latest alerts. Refreshes itself. Figures are formatted in
:mod:`kmq_dagster.console.overview_format`."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from kmq_dagster.console import queries, session
from kmq_dagster.console.overview_format import (
    WINDOWS,
    alert_rows,
    arrival_frame,
    summary_row,
    window_bucket_s,
)
from kmq_dagster.console.rendering import static_table
from kmq_dagster.core.readable import bucket_label

#: Alerts the Overview shows (the Breakers & alerts page has the rest).
LATEST_ALERTS = 5


def overview() -> None:
    store = session.store()
    now = datetime.now(UTC)
    summaries = queries.queue_summaries(store)
    if not summaries:
        st.info("No queue has dead letters, snapshots or a circuit breaker yet.")
    else:
        # a static table wraps long cells (a breaker "half-open for 1m 12s") instead of
        # cutting them at a column's edge
        st.table(static_table([summary_row(s, now) for s in summaries]), hide_index=True)
    if not any(s.snapshot for s in summaries):
        st.info(
            "No queue snapshots yet: lag, in flight and the oldest unacknowledged age come "
            "from the Dagster observation sensor, which has not written any."
        )
    window = st.selectbox("Charts", list(WINDOWS), index=0, key="overview-window")
    since = now - WINDOWS[window]
    bucket_s = window_bucket_s(WINDOWS[window])
    left, right = st.columns(2)
    with left:
        st.subheader("Lag")
        series = queries.snapshot_series(store, since)
        if series:
            lag = pd.DataFrame(series).pivot_table(index="at", columns="queue", values="lag")
            st.line_chart(lag, x_label="UTC", y_label="messages not fetched yet")
        else:
            st.text("No snapshots in this window.")
    with right:
        st.subheader("Dead-letter arrivals")
        arrived = queries.arrivals(store, since, bucket_s)
        if arrived:
            table = arrival_frame(arrived, since, now, bucket_s)
            st.bar_chart(table, x_label=bucket_label(bucket_s), y_label="dead letters")
        else:
            st.text("No dead letters in this window.")
    st.subheader("Latest alerts")
    alerts = alert_rows(queries.recent_alerts(store, limit=LATEST_ALERTS))
    if alerts:
        st.table(static_table(alerts), hide_index=True)  # wraps long texts, shows them whole
    else:
        st.text("No alerts raised.")
    st.caption(f"Updated {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC")


session.principal()
st.title("Overview")
st.fragment(run_every=session.config().refresh_s)(overview)()
