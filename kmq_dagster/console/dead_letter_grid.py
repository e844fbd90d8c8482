"""How the Dead letters page's tables fit a laptop screen (1280 px wide, the sidebar open):
every column on screen at once, every cell whole (long texts wrap in rows three lines high,
previews end in an ellipsis instead of at a column's edge), every row of a page shown without
an inner scroll bar.

The CSV download keeps every column at full length; the detail of a dead letter shows each
text whole. Functions of the rows that draw nothing, so the layout is testable.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.core.dead_letter_formats import FORMATS

#: Width the list's columns share at 1280 px with the sidebar open (the selection checkboxes
#: take the rest); on a wider screen Streamlit stretches them in proportion.
LIST_WIDTH_PX = 776
#: Rows three lines high: Streamlit wraps text cells in rows taller than 4rem.
ROW_HEIGHT_PX = 70
#: Height of the header row and of a one-line row (Streamlit's default).
HEADER_PX = 35
#: Lines a cell's text may take in a row of :data:`ROW_HEIGHT_PX`.
LINES = 3
#: Average width of a character of the grid's 14 px font, for cutting previews to fit.
CHAR_PX = 7
#: Fixed widths (px) of the list's columns; "error message" takes what is left.
WIDTHS_PX = {
    "id": 50,
    "last failure": 96,
    "queue / group": 120,
    "original": 120,
    "status": 80,
    "error type": 140,
    "reason": 150,
    "key": 80,
}
#: Fixed widths (px) of the causes' columns; "error pattern" takes what is left.
CAUSE_WIDTHS_PX = {"error type": 150, "count": 120, "latest": 150}
HELP = {
    "last failure": "when it failed for the last time (UTC)",
    "error message": "its start; open the dead letter below to read it whole",
    "reason": "why it was dead-lettered instead of retried",
    "key": "as text if it is printable UTF-8, else 0x and its hex",
    "original": "where the message was first produced: topic[partition]@offset",
}


def list_columns(where: DeadLetterFilter) -> list[str]:
    """The list's columns: queue and status only when the filter does not fix them; where a
    foreign dead-letter topic's dead letters came from when it is the one shown."""
    columns = ["id", "last failure"]
    if where.queue_topic is None or where.group_id is None:
        columns.append("queue / group")
    elif where.group_id in FORMATS:  # another framework's dead letters: where they came from
        columns.append("original")
    if where.status is None:
        columns.append("status")
    return [*columns, "error type", "error message", "reason", "key"]


def original_text(dead_letter: DeadLetter) -> str:
    """Where the message was first produced: ``topic[partition]@offset`` (what is known)."""
    if not dead_letter.original_topic:
        return ""
    partition, offset = dead_letter.original_partition, dead_letter.original_offset
    return (
        f"{dead_letter.original_topic}[{'?' if partition is None else partition}]"
        f"@{'?' if offset is None else offset}"
    )


def list_frame(table: pd.DataFrame, where: DeadLetterFilter) -> pd.DataFrame:
    """The page's rows (:func:`~kmq_dagster.console.views.dead_letters.table_row` columns)
    as the grid shows them, in the same order (a selected row's index is the table's)."""
    columns = list_columns(where)
    message_px = message_width_px(columns)
    grid = pd.DataFrame(index=table.index)
    grid["id"] = table["id"]
    grid["last failure"] = [_time(at) for at in table["last failure"]]
    grid["queue / group"] = table["queue"].astype(str) + " / " + table["group"].astype(str)
    if "original" in columns:
        grid["original"] = [_cut(str(o), WIDTHS_PX["original"]) for o in table["original"]]
    grid["status"] = table["status"]
    grid["error type"] = [_cut(str(t), WIDTHS_PX["error type"]) for t in table["error type"]]
    grid["error message"] = [_cut(str(m), message_px) for m in table["error message"]]
    grid["reason"] = [_cut(str(r), WIDTHS_PX["reason"]) for r in table["reason"]]
    grid["key"] = [_cut(str(k), WIDTHS_PX["key"]) for k in table["key"]]
    return grid[columns]


def message_width_px(columns: list[str]) -> int:
    """What the other columns leave the error message."""
    return LIST_WIDTH_PX - sum(WIDTHS_PX[c] for c in columns if c in WIDTHS_PX)


def list_config(columns: list[str]) -> dict[str, Any]:
    """Column widths and help texts of the list."""
    widths = {**WIDTHS_PX, "error message": message_width_px(columns)}
    return {
        name: st.column_config.TextColumn(name, width=widths[name], help=HELP.get(name))
        if name != "id"
        else st.column_config.NumberColumn(name, width=widths[name])
        for name in columns
    }


def cause_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The causes (error type, error pattern, count, latest) as their grid shows them."""
    pattern_px = LIST_WIDTH_PX - sum(CAUSE_WIDTHS_PX.values())
    type_px = CAUSE_WIDTHS_PX["error type"]
    return table.assign(
        **{
            "error type": [_cut(str(t), type_px) for t in table["error type"]],
            "error pattern": [_cut(str(p), pattern_px) for p in table["error pattern"]],
            "latest": [_time(at) for at in table["latest"]],
        }
    )


def cause_config(most: int) -> dict[str, Any]:
    """The causes' column widths; each count drawn as a bar beside its cause (of ``most``)."""
    widths = CAUSE_WIDTHS_PX
    return {
        "error type": st.column_config.TextColumn(width=widths["error type"]),
        "error pattern": st.column_config.TextColumn(
            width=LIST_WIDTH_PX - sum(widths.values()),
            help="the error message with numbers and ids replaced by <n>",
        ),
        "count": st.column_config.ProgressColumn(
            format="%d", min_value=0, max_value=max(most, 1), width=widths["count"]
        ),
        "latest": st.column_config.TextColumn(width=widths["latest"], help="UTC"),
    }


def height_px(rows: int, row_px: int = HEADER_PX) -> int:
    """A grid's height that shows ``rows`` rows whole, without an inner scroll bar."""
    return HEADER_PX + max(rows, 1) * row_px + 3  # 3: the borders


def _cut(text: str, width_px: int) -> str:
    """``text`` cut to what :data:`LINES` lines of ``width_px`` hold, ending in an ellipsis
    when cut (a preview that says so, not text cut at a column's edge)."""
    fits = ((width_px - 16) // CHAR_PX - 3) * LINES  # 16: padding; 3: words wrap early
    if len(text) <= fits:
        return text
    return text[: max(fits - 1, 1)].rstrip() + "\N{HORIZONTAL ELLIPSIS}"


def _time(moment: Any) -> str:
    """A stored time to the second (UTC), with a space where the cell may wrap."""
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment is not None else ""
