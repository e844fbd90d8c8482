"""Overview: per queue and group, lag, in flight, oldest unacknowledged age, dead letters by
status and breaker state; charts of lag and dead-letter arrivals. Refreshes itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import streamlit as st

from kmq_dagster.console import queries, session
from kmq_dagster.console.queries import QueueSummary

#: Chart windows: label -> (length, bucket of the arrivals chart in seconds).
WINDOWS = {
    "last hour": (timedelta(hours=1), 60),
    "last 24 hours": (timedelta(hours=24), 3600),
    "last 7 days": (timedelta(days=7), 86_400),
}


def summary_row(summary: QueueSummary) -> dict[str, object]:
    snapshot = summary.snapshot
    counts = summary.dead_letters
    return {
        "queue": summary.queue_topic,
        "group": summary.group_id,
        "lag": snapshot.lag if snapshot else None,
        "in flight": snapshot.inflight if snapshot else None,
        "oldest unacked (s)": (
            snapshot.oldest_unacked_age_ms / 1000
            if snapshot and snapshot.oldest_unacked_age_ms is not None
            else None
        ),
        "in/s": snapshot.in_rate if snapshot else None,
        "acked/s": snapshot.ack_rate if snapshot else None,
        "snapshot at": snapshot.at if snapshot else None,
        "DL new": counts.get("new", 0),
        "DL replayed": counts.get("replayed", 0),
        "DL discarded": counts.get("discarded", 0),
        "breaker": summary.breaker_state or "",
        "breaker since": summary.breaker_since,
    }


def overview() -> None:
    store = session.store()
    summaries = queries.queue_summaries(store)
    if not summaries:
        st.info("No queue has dead letters, snapshots or a circuit breaker yet.")
    else:
        st.dataframe(pd.DataFrame([summary_row(s) for s in summaries]), hide_index=True)
    if not any(s.snapshot for s in summaries):
        st.info(
            "No queue snapshots yet: lag, in flight and the oldest unacknowledged age come "
            "from the Dagster observation sensor, which has not written any."
        )
    window = st.selectbox("Charts", list(WINDOWS), index=1, key="overview-window")
    length, bucket_s = WINDOWS[window]
    since = datetime.now(UTC) - length
    left, right = st.columns(2)
    with left:
        st.subheader("Lag")
        series = queries.snapshot_series(store, since)
        if series:
            lag = pd.DataFrame(series).pivot_table(index="at", columns="queue", values="lag")
            st.line_chart(lag)
        else:
            st.text("No snapshots in this window.")
    with right:
        st.subheader("Dead-letter arrivals")
        arrived = queries.arrivals(store, since, bucket_s)
        if arrived:
            table = pd.DataFrame(arrived).pivot_table(
                index="at", columns="queue", values="dead letters", aggfunc="sum"
            )
            st.bar_chart(table)
        else:
            st.text("No dead letters in this window.")
    st.caption(f"Updated {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC")


session.principal()
st.title("Overview")
st.fragment(run_every=session.config().refresh_s)(overview)()
