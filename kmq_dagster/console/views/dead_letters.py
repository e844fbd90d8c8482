"""Dead letters: server-side filters, keyset pages with multi-row selection, counts by cause
(click one to filter), the detail of one dead letter, and replay/discard for operators."""

from __future__ import annotations

import logging

import pandas as pd
import streamlit as st

from kmq_dagster.audit import browse
from kmq_dagster.audit.browse import CauseCount
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.console import action_dialogs, dead_letter_grid, filter_form, session
from kmq_dagster.console.auth import OPERATOR
from kmq_dagster.console.detail_view import show_detail
from kmq_dagster.console.downloads import download_button
from kmq_dagster.console.rendering import escape_markdown, key_text, row_preview, schema_text

PAGE_SIZE = 50
PENDING_CAUSE_KEY = "kmq_pending_cause"
CAUSE_CLICKS_KEY = "kmq_cause_clicks"
VIEW_KEY = "dead-letters-view"
LIST, BY_CAUSE = "List", "By cause"


@st.cache_data(ttl=10, show_spinner=False)
def _queues(url: str) -> list[tuple[str, str]]:
    return browse.queues(session.store())


@st.cache_data(ttl=10, show_spinner=False)
def _causes(url: str, where: DeadLetterFilter) -> list[CauseCount]:
    return browse.cause_counts(session.store(), where)


_log = logging.getLogger(__name__)


def table_row(dead_letter: DeadLetter) -> dict[str, object]:
    """One row of the table; a row that cannot be shown says so instead of failing the page."""
    try:
        return _row(dead_letter)
    except Exception as exc:  # one bad row must never take the page down for everyone
        _log.warning("cannot show dead letter #%s", dead_letter.id, exc_info=True)
        placeholder = f"(cannot be shown: {type(exc).__name__})"
        return dict.fromkeys(table_row_columns(), placeholder) | {"id": dead_letter.id}


def _row(dead_letter: DeadLetter) -> dict[str, object]:
    masker = session.config().masker
    return {
        "id": dead_letter.id,
        "last failure": dead_letter.last_failure_at,
        "queue": dead_letter.queue_topic,
        "group": dead_letter.group_id,
        "status": dead_letter.status,
        "error type": dead_letter.error_type,
        "error message": dead_letter.error_message[:200],
        "reason": dead_letter.reason,
        "key": key_text(dead_letter.key),
        "value": row_preview(dead_letter, masker),
        "value schema": schema_text(dead_letter),
        "attempts": dead_letter.attempts,
        "original": dead_letter_grid.original_text(dead_letter),
    }


def show_causes(causes: list[CauseCount]) -> None:
    if not causes:
        st.text("No dead letters match.")
        return
    table = pd.DataFrame(
        [{"error type": c.error_type, "error pattern": c.error_pattern, "count": c.count,
          "latest": c.latest} for c in causes]
    )  # fmt: skip
    st.text("Click a cause to list its dead letters.")
    clicks = int(st.session_state.get(CAUSE_CLICKS_KEY, 0))
    # the counts as bars in the table itself: each cause's name stays whole beside its bar
    event = st.dataframe(
        dead_letter_grid.cause_frame(table), hide_index=True, key=f"causes-table-{clicks}",
        on_select="rerun", selection_mode="single-row",
        column_config=dead_letter_grid.cause_config(int(table["count"].max())),
        row_height=dead_letter_grid.ROW_HEIGHT_PX,
        height=dead_letter_grid.height_px(len(table), dead_letter_grid.ROW_HEIGHT_PX),
    )  # fmt: skip
    if event.selection.rows:
        cause = causes[event.selection.rows[0]]
        st.session_state[PENDING_CAUSE_KEY] = (cause.error_type, cause.error_pattern)
        st.session_state[CAUSE_CLICKS_KEY] = clicks + 1  # a fresh table: no selection left
        st.rerun()


def apply_clicked_cause() -> None:
    """A cause clicked in the last run: filter by it and show the list (before the widgets
    holding the filter and the view are drawn, as Streamlit requires)."""
    pending = st.session_state.pop(PENDING_CAUSE_KEY, None)
    if pending:
        filter_form.apply_cause(*pending)
        st.session_state[VIEW_KEY] = LIST


def show_list(where: DeadLetterFilter, total: int) -> None:
    store = session.store()
    stack = filter_form.cursors()
    result = browse.page(store, where, after=stack[-1], size=PAGE_SIZE)
    table = pd.DataFrame([table_row(d) for d in result.rows], columns=list(table_row_columns()))
    page_key = f"{hash(where)}-{len(stack)}"
    grid = dead_letter_grid.list_frame(table, where)
    event = st.dataframe(
        grid, hide_index=True, key=f"table-{page_key}", on_select="rerun",
        selection_mode="multi-row", column_config=dead_letter_grid.list_config(list(grid)),
        row_height=dead_letter_grid.ROW_HEIGHT_PX,
        height=dead_letter_grid.height_px(len(grid), dead_letter_grid.ROW_HEIGHT_PX),
    )  # fmt: skip
    selected = [int(table["id"].iloc[i]) for i in event.selection.rows]
    newer, position, older = st.columns([1, 2, 1])
    if newer.button("Newer", disabled=len(stack) == 1, icon=":material/arrow_back:"):
        stack.pop()
        st.rerun()
    position.text(f"Page {len(stack)}: {len(result.rows)} of {total:,} matching; "
                  f"{len(selected)} selected")  # fmt: skip
    if older.button("Older", disabled=result.next_cursor is None, icon=":material/arrow_forward:"):
        stack.append(result.next_cursor)
        st.rerun()
    actions(where, selected, total)
    download_button(
        "Download this page as CSV (masked)", lambda: table.to_csv(index=False),
        file_name="dead-letters.csv", mime="text/csv", key=f"csv-{page_key}",
        allowed=session.may_download(session.config()),
    )  # fmt: skip
    detail(result.rows, selected, page_key)


def table_row_columns() -> tuple[str, ...]:
    return ("id", "last failure", "queue", "group", "status", "error type", "error message",
            "reason", "key", "value", "value schema", "attempts", "original")  # fmt: skip


def actions(where: DeadLetterFilter, selected: list[int], total: int) -> None:
    if not session.principal().has(OPERATOR):
        st.caption("Your role can browse and export; replay and discard need the operator role.")
        return
    some = DeadLetterFilter(ids=tuple(selected))
    chosen = f"{len(selected)} selected dead letters"
    matching = f"all {total:,} matching: {filter_form.filter_text(where)}"
    cols = st.columns(4)
    if cols[0].button(f"Replay selected ({len(selected)})", disabled=not selected):
        action_dialogs.open_dialog("replay", some, chosen)
    if cols[1].button(f"Discard selected ({len(selected)})", disabled=not selected):
        action_dialogs.open_dialog("discard", some, chosen)
    if cols[2].button(f"Replay all matching ({total:,})", disabled=not total):
        action_dialogs.open_dialog("replay", where, matching)
    if cols[3].button(f"Discard all matching ({total:,})", disabled=not total):
        action_dialogs.open_dialog("discard", where, matching)


def detail(rows: list[DeadLetter], selected: list[int], page_key: str) -> None:
    by_id = {row.id: row for row in rows}
    options: list[int | None] = [None, *by_id]
    start = options.index(selected[0]) if len(selected) == 1 and selected[0] in by_id else 0
    chosen = st.selectbox(
        "Open dead letter",
        options,
        index=start,
        format_func=lambda i: "(choose one)" if i is None else _label(by_id[i]),
        key=f"open-{page_key}-{selected[0] if len(selected) == 1 else ''}",
    )
    if chosen is not None:
        show_detail(session.store(), by_id[chosen], session.config().masker)


def _label(row: DeadLetter) -> str:
    return f"#{row.id}  key {key_text(row.key)[:40]}  {row.error_type}"


session.principal()
st.title("Dead letters")
notice = st.session_state.pop(action_dialogs.NOTICE_KEY, None)
if notice:
    st.success(escape_markdown(notice))
apply_clicked_cause()
filter_form.show_form(_queues(session.config().audit_url))
applied = filter_form.applied()
st.text(f"Showing {filter_form.filter_text(applied)}")
counted = _causes(session.config().audit_url, applied)
view = st.segmented_control("View", [LIST, BY_CAUSE], default=LIST, key=VIEW_KEY) or LIST
if view == BY_CAUSE:
    show_causes(counted)
else:
    show_list(applied, sum(c.count for c in counted))
action_dialogs.show_open_dialog()
