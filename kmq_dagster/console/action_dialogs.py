"""Replay and discard dialogs: choose, preview with a dry run, confirm a named count and
target. The acting functions in :mod:`.operations` check the role again; these dialogs are
only ever opened for operators, which is a convenience, not the protection."""

from __future__ import annotations

import dataclasses

import pandas as pd
import streamlit as st

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.console import operations, session
from kmq_dagster.console.operations import ReplayPlan, ReplayPreview
from kmq_dagster.console.rendering import sample_rows
from kmq_dagster.core.replay import DEFAULT_MAX_REPLAYS, TO_ORIGINAL, TO_RETRY
from kmq_dagster.core.wording import counted

DIALOG_KEY = "kmq_dialog"
PREVIEW_KEY = "kmq_replay_preview"
STARTED_KEY = "kmq_started_job"
NOTICE_KEY = "kmq_notice"
#: The dialog's choice of a topic named by the operator.
CHOSEN_TOPIC = "topic"
TARGETS = {
    "this group only, on its redelivery topic (a replay never counts as a failure)": TO_RETRY,
    "the original queue topic (every group consuming it sees them; another framework's dead "
    "letters: each one's own original topic)": TO_ORIGINAL,
    "a topic I name": CHOSEN_TOPIC,
}


def open_dialog(kind: str, where: DeadLetterFilter, described: str) -> None:
    """Open the ``replay`` or ``discard`` dialog for ``where`` (``described`` for people)."""
    st.session_state[DIALOG_KEY] = (kind, where, described)
    st.session_state.pop(PREVIEW_KEY, None)


def close_dialog() -> None:
    st.session_state.pop(DIALOG_KEY, None)
    st.session_state.pop(PREVIEW_KEY, None)


def show_open_dialog() -> None:
    """Keep the open dialog open across reruns."""
    opened = st.session_state.get(DIALOG_KEY)
    if not opened:
        return
    kind, where, described = opened
    if kind == "replay":
        replay_dialog(where, described)
    else:
        discard_dialog(where, described)


@st.dialog("Replay dead letters", width="large", on_dismiss=close_dialog)
def replay_dialog(where: DeadLetterFilter, described: str) -> None:
    st.text(f"Selection: {described}")
    target = TARGETS[st.selectbox("Send the copies to", list(TARGETS), key="replay-target")]
    to_topic = None
    if target == CHOSEN_TOPIC:
        target = TO_ORIGINAL
        to_topic = st.text_input("Topic", key="replay-to-topic").strip() or None
        if to_topic is None:
            st.text("Name the topic the copies go to.")
            return
    rate = st.number_input(
        "Rate limit, copies per second (0: as fast as the broker takes them)",
        min_value=0.0, value=0.0, step=10.0, key="replay-rate",
    )  # fmt: skip
    max_replays = st.number_input(
        "Skip messages already replayed this many times (the loop guard)",
        min_value=1, value=DEFAULT_MAX_REPLAYS, step=1, key="replay-max",
    )  # fmt: skip
    plan = ReplayPlan(where, target, float(rate) or None, int(max_replays), to_topic)
    if st.button("Dry run", key="replay-dry-run"):
        with st.spinner("Scanning the DLQ..."):
            preview = session.attempt(
                lambda: operations.preview_replay(
                    session.principal(), session.kafka_settings(), session.store(), plan
                )
            )
        if preview is not None:
            st.session_state[PREVIEW_KEY] = (plan, preview)
    stored = st.session_state.get(PREVIEW_KEY)
    if not stored or stored[0] != plan:
        st.text("Run a dry run to see what would move.")
        return
    _show_preview(stored[1])
    count = stored[1].report.movable
    if count and st.button(
        f"Replay {counted(count, 'dead letter')}", type="primary", key="replay-go"
    ):
        job = session.attempt(
            lambda: operations.start_replay(
                session.principal(), session.kafka_settings(), session.store(), plan
            )
        )
        if job is not None:
            st.session_state[STARTED_KEY] = job.id
            st.session_state[NOTICE_KEY] = (
                f"Replay {job.replay_id} started: {counted(count, 'dead letter')} to "
                f"{job.target_topic}. "
                "Follow it on the Actions page."
            )
            close_dialog()
            st.rerun()


def _show_preview(preview: ReplayPreview) -> None:
    report = preview.report
    st.text(
        f"Dry run: {counted(report.movable, 'dead letter')} would be replayed to "
        f"{preview.target_topic}.\n"
        f"Selected {report.selected} of {report.scanned} scanned; skipped at the replay limit "
        f"{report.over_limit}; discarded {report.discarded}"
        + (
            f"; left where they are for want of an original topic {report.no_original_topic}."
            if report.no_original_topic
            else "."
        )
    )
    if report.by_error_type:
        counts = [{"error type": k, "count": n} for k, n in report.by_error_type.most_common()]
        st.dataframe(pd.DataFrame(counts), hide_index=True)
    if report.listed:
        st.text(f"The first {counted(len(report.listed), 'dead letter')} it would replay")
        st.dataframe(pd.DataFrame(sample_rows(report.listed)), hide_index=True)


@st.dialog("Discard dead letters", width="large", on_dismiss=close_dialog)
def discard_dialog(where: DeadLetterFilter, described: str) -> None:
    st.text(f"Selection: {described}")
    store = session.store()
    # A discard only touches new dead letters.
    count = (
        0
        if where.status not in (None, "new")
        else store.count_dead_letters(dataclasses.replace(where, status="new"))
    )
    st.text(
        f"{count} new dead letters would be marked discarded: replays skip them from then on. "
        "The DLQ topic itself is not changed."
    )
    reason = st.text_input("Reason (required; kept in the audit log)", key="discard-reason")
    if st.button(
        f"Discard {counted(count, 'dead letter')}",
        type="primary",
        disabled=not count,
        key="discard-go",
    ):
        done = session.attempt(
            lambda: operations.discard(session.principal(), store, where, reason=reason)
        )
        if done is not None:
            st.session_state[NOTICE_KEY] = f"Discarded {counted(done, 'dead letter')}."
            close_dialog()
            st.rerun()
