"""One dead letter in full: metadata, value (JSON, text or hex), headers, error, traceback,
and its history. Every piece of message data goes through a literal element."""

from __future__ import annotations

import json
import logging
from datetime import datetime

import pandas as pd
import streamlit as st

from kmq_dagster.audit.history import HistoryEntry, history
from kmq_dagster.audit.history_events import REPLAY
from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console import session
from kmq_dagster.console.copies import copy_fates
from kmq_dagster.console.downloads import download_button
from kmq_dagster.console.masking import Masker
from kmq_dagster.console.rendering import (
    BINARY,
    EMPTY,
    JSON,
    escape_markdown,
    export,
    header_rows,
    key_text,
    schema_text,
    undecodable_text,
    view_value,
)
from kmq_dagster.core.dead_letter_formats import TRACEBACK_HEADERS
from kmq_dagster.core.oversize import REFERENCE_HEADERS, Reference, reference_of
from kmq_dagster.core.wording import counted

FORMATS = ("JSON", "Text", "Hex")
_log = logging.getLogger(__name__)
#: Height of a table row in pixels (Streamlit's default), to show short tables whole.
_ROW_PX = 35


def show_detail(store: AuditStore, dead_letter: DeadLetter, masker: Masker) -> None:
    st.subheader(f"Dead letter #{dead_letter.id}")
    facts = _facts(dead_letter)
    st.dataframe(pd.DataFrame(facts), hide_index=True, height=_ROW_PX * (len(facts) + 1) + 3)
    value_tab, headers_tab, error_tab, history_tab = st.tabs(
        ["Value", "Headers", "Error", "History"]
    )
    with value_tab:
        try:
            _value(dead_letter, masker)
        except Exception as exc:  # the rest of the dead letter (and Discard) must still show
            _log.warning("cannot show dead letter #%s", dead_letter.id, exc_info=True)
            st.warning(f"This value cannot be shown ({type(exc).__name__}).")
    with headers_tab:
        rows = header_rows(dead_letter, masker)
        st.dataframe(pd.DataFrame(rows, columns=["name", "value", "encoding"]), hide_index=True)
    with error_tab:
        st.text("Error message")
        st.code(dead_letter.error_message or "(none)", language=None)
        traceback = _traceback(dead_letter)
        st.text("Traceback")
        st.code(traceback or "(none recorded)", language=None)
    with history_tab:
        entries = history(store, dead_letter)
        fates = session.attempt(
            lambda: copy_fates(session.kafka_settings(), dead_letter.group_id, entries)
        )
        fate_of = fates or {}
        steps = [_history_row(e, dead_letter.id, fate_of.get(i)) for i, e in enumerate(entries)]
        st.dataframe(pd.DataFrame(steps), hide_index=True)
    download_button(
        "Download as JSON (masked)",
        lambda: json.dumps(export(dead_letter, masker), indent=2, ensure_ascii=False),
        file_name=f"dead-letter-{dead_letter.id}.json",
        mime="application/json",
        key=f"export-{dead_letter.id}",
        allowed=session.may_download(session.config()),
    )


def _facts(d: DeadLetter) -> list[dict[str, str]]:
    original = (
        f"{d.original_topic} [{d.original_partition}] @ {d.original_offset}"
        if d.original_topic
        else "unknown"
    )
    size = f"{d.value_size:,} bytes" + (" (stored cut at 64 KB)" if d.value_truncated else "")
    reference = _reference(d)
    if reference is not None:
        size = (
            f"{reference.size_bytes:,} bytes, not in the DLQ: too large to copy; a reference to "
            f"{reference.ref.describe()} (replay reads it from there)"
        )
    facts = {
        "queue / group": f"{d.queue_topic} / {d.group_id}",
        "status": d.status,
        "key": key_text(d.key),
        "error type": d.error_type,
        "reason": d.reason,
        "attempts": str(d.attempts),
        "first failure": _time(d.first_failure_at),
        "last failure (dead-lettered)": _time(d.last_failure_at),
        "original coordinates": original,
        "DLQ coordinates": f"{d.dlq_topic} [{d.dlq_partition}] @ {d.dlq_offset}",
        "value size": size,
    }
    if d.schema_id is not None:
        facts["value schema"] = schema_text(d)
    return [{"field": name, "value": value} for name, value in facts.items()]


def _reference(d: DeadLetter) -> Reference | None:
    """The reference a dead letter is (``core.oversize``): a message too large to copy whose
    bytes stay in its source topic; ``None`` for an ordinary (or unreadable) one."""
    texts = [
        (str(name), str(value).encode())
        for name, value, is_base64 in d.headers or []
        if name in REFERENCE_HEADERS and value is not None and not is_base64
    ]
    try:
        return reference_of(texts)
    except ValueError:
        return None


def _value(dead_letter: DeadLetter, masker: Masker) -> None:
    reference = _reference(dead_letter)
    if reference is not None:
        st.info(
            f"Too large to copy ({reference.size_bytes:,} bytes): this dead letter is a "
            f"reference. The message is at {reference.ref.describe()} while that topic "
            "retains it; a replay reads it from there. The reason says which copy was refused."
        )
        return
    view = view_value(dead_letter.value, masker)
    if view.kind == EMPTY:
        st.text("(no value)")
        return
    default = {JSON: 0, BINARY: 2}.get(view.kind, 1)
    if dead_letter.value_undecodable is not None:
        st.warning(escape_markdown(f"{undecodable_text(dead_letter)}. Its bytes are in hex."))
        default = 2
    elif dead_letter.schema_id is not None:
        st.caption(escape_markdown(f"Decoded from {schema_text(dead_letter)}."))
    shown = st.selectbox("Show as", FORMATS, index=default, key=f"format-{dead_letter.id}")
    if view.masked_fields:
        st.caption(f"{counted(view.masked_fields, 'sensitive field')} masked")
    if view.note:
        st.caption(view.note)
    if shown == "JSON" and view.kind == JSON:
        st.json(view.document)
    elif shown == "Hex":
        st.code(view.hex, language=None)
    else:
        if shown == "JSON":
            st.caption("Not JSON: shown as text.")
        st.code(view.text, language=None)


def _traceback(dead_letter: DeadLetter) -> str | None:
    """The failed attempt's traceback from the stored headers, if any."""
    for name, value, is_base64 in dead_letter.headers or []:
        if name in TRACEBACK_HEADERS and value is not None:
            return "(not UTF-8)" if is_base64 else str(value)
    return None


def _history_row(entry: HistoryEntry, current_id: int, fate: str | None) -> dict[str, object]:
    copy = ""
    if entry.kind == REPLAY:
        copy = f"{entry.copy_topic} [{entry.copy_partition}] @ {entry.copy_offset}"
        if fate is None:  # Kafka did not answer: what the store knows
            fate = (
                f"failed again: dead letter #{entry.came_back_as}"
                if entry.came_back_as
                else "not dead-lettered again"
            )
    return {
        "at": _time(entry.at),
        "what": entry.kind,
        "dead letter": f"#{entry.dead_letter_id}" + (" (this)" if entry.dead_letter_id ==
                                                      current_id else ""),
        "by": entry.actor or "",
        "detail": entry.detail,
        "replayed copy": copy,
        "what became of it": fate or "",
    }  # fmt: skip


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
