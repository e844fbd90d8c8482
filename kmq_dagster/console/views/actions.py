"""Actions: replays running in the background (progress, cancel) and the audit trail of every
replay and discard, with who did it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kmq_dagster.console import jobs, operations, queries, session
from kmq_dagster.console.auth import OPERATOR
from kmq_dagster.console.downloads import download_button
from kmq_dagster.console.jobs import RUNNING
from kmq_dagster.console.login_guard import LOGIN_FAILED

KINDS = ("any", "replay", "discard", LOGIN_FAILED)


def show_jobs() -> None:
    known = jobs.jobs()
    if not known:
        st.text("No replay started from this console since it started.")
        return
    may_cancel = session.principal().has(OPERATOR)
    for job in known:
        with st.container(border=True):
            st.text(
                f"Replay {job.replay_id} by {job.actor}: {job.queue_topic} / {job.group_id} -> "
                f"{job.target_topic}, {job.state}"
            )
            st.progress(
                job.fraction_done,
                text=f"{job.replayed:,} of {job.expected:,} replayed, {job.scanned:,} scanned",
            )
            if job.summary:
                st.text(job.summary)
            if job.state == RUNNING and may_cancel:
                if job.cancel.is_set():
                    st.text("Cancelling after the current chunk...")
                elif st.button("Cancel", key=f"cancel-{job.id}"):
                    with session.reported_errors():
                        operations.cancel_replay(session.principal(), job)
                        st.rerun(scope="fragment")


def show_trail() -> None:
    first, second = st.columns(2)
    kind = first.selectbox("Kind", KINDS, key="actions-kind")
    actor = second.text_input("Actor", key="actions-actor").strip()
    found = queries.recent_actions(
        session.store(), limit=500, kind=None if kind == "any" else kind, actor=actor or None
    )
    if not found:
        st.text("No actions recorded.")
        return
    table = pd.DataFrame(
        [{"at": a.at, "actor": a.actor, "kind": a.kind, "dry run": a.dry_run,
          "queue": a.queue_topic, "group": a.group_id, "count": a.count, "target": a.target,
          "outcome": a.outcome, "selection": a.selection} for a in found]
    )  # fmt: skip
    st.dataframe(table, hide_index=True)
    download_button(
        "Download as CSV", lambda: table.to_csv(index=False), file_name="kmq-actions.csv",
        mime="text/csv", key="actions-csv", allowed=session.may_download(session.config()),
    )  # fmt: skip


session.principal()
st.title("Actions")
st.subheader("Replays")
st.fragment(run_every=1)(show_jobs)()
st.subheader("Audit trail")
show_trail()
