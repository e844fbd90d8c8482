"""The Dead letters page's filters: the form, the filter it applies, and the page position.

The applied filter lives in the session apart from the form's widgets, so typing in the form
changes nothing until "Apply"; a click on a cause applies its error type and pattern at once.
Every value goes to the store as a bound parameter (see :mod:`kmq_dagster.audit.filters`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import streamlit as st

from kmq_dagster.audit.browse import Cursor
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.console.masking import Masker
from kmq_dagster.console.overview_format import time_text
from kmq_dagster.console.rendering import key_text
from kmq_dagster.console.session import attempt, config
from kmq_dagster.core.replay import parse_time_ms
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.clients import wall_clock_ms

FILTER_KEY = "kmq_filter"
CURSORS_KEY = "kmq_cursors"
ANY = "any"
ALL_QUEUES = "all queues"
STATUS_CHOICES = ("new", "replayed", "discarded", ANY)
#: Form widget keys, by the filter field they fill.
FIELDS = ("queue", "status", "error_type", "error_pattern", "reason", "key", "search", "header",
          "since", "until")  # fmt: skip
DEFAULT = DeadLetterFilter(status="new")


def widget_key(name: str) -> str:
    return f"filter-{name}"


def applied() -> DeadLetterFilter:
    found = st.session_state.get(FILTER_KEY)
    return found if isinstance(found, DeadLetterFilter) else DEFAULT


def apply(where: DeadLetterFilter) -> None:
    """Make ``where`` the page's filter and go back to the first page."""
    st.session_state[FILTER_KEY] = where
    st.session_state[CURSORS_KEY] = [None]


def cursors() -> list[Cursor | None]:
    """The start of every page up to the current one (``None``: the first page)."""
    stack = st.session_state.setdefault(CURSORS_KEY, [None])
    return stack if isinstance(stack, list) else [None]


def filter_of(
    form: Mapping[str, Any], now_ms: int, *, masker: Masker | None = None
) -> DeadLetterFilter:
    """The filter the form's values describe (blank fields do not filter).

    Raises:
        ConfigError: a time, status or header the filter refuses, or a value asked of a
            header ``masker`` masks (its value could be guessed by filtering for it).
    """

    def text(name: str) -> str | None:
        value = str(form.get(name) or "").strip()
        return value or None

    def moment(name: str) -> datetime | None:
        value = text(name)
        return datetime.fromtimestamp(parse_time_ms(value, now_ms) / 1000, UTC) if value else None

    queue = text("queue")
    topic, group = queue.split(" / ", 1) if queue and queue != ALL_QUEUES else (None, None)
    header = text("header")
    name, sep, value = (header or "").partition("=")
    if sep and masker is not None and masker.is_sensitive(name.strip()):
        raise ConfigError(f"{name.strip()} is masked: filter by the header's name only")
    key = text("key")
    return DeadLetterFilter(
        queue_topic=topic,
        group_id=group,
        status=None if text("status") in (None, ANY) else text("status"),
        error_type=text("error_type"),
        error_pattern=text("error_pattern"),
        reason=text("reason"),
        key=key.encode() if key is not None else None,
        search=text("search"),
        header=(name.strip(), value if sep else None) if header else None,
        since=moment("since"),
        until=moment("until"),
    )


def filter_text(where: DeadLetterFilter) -> str:
    """The filter as a person reads it: ``new dead letters of orders / billing, error type
    TimeoutError`` (not the code-like form :meth:`DeadLetterFilter.describe` gives the audit
    log). Values are shown as given; pages show this through literal text elements."""
    status = f"{where.status} dead letters" if where.status else "dead letters of any status"
    if where.queue_topic or where.group_id:
        status += f" of {where.queue_topic or 'any queue'} / {where.group_id or 'any group'}"
    parts = [status]
    for label, value in (
        ("error type", where.error_type),
        ("error pattern", where.error_pattern),
        ("reason contains", where.reason),
        ("key", None if where.key is None else key_text(where.key)),
        ("value or error message contains", where.search),
        ("error message or reason contains", where.text),
        ("header", _header_text(where.header)),
        ("since", time_text(where.since) if where.since else None),
        ("until", time_text(where.until) if where.until else None),
    ):
        if value is not None:
            parts.append(f"{label} {value}")
    if where.ids is not None:
        parts.append(f"{len(where.ids)} chosen by id")
    return ", ".join(parts)


def _header_text(header: tuple[str, str | None] | None) -> str | None:
    if header is None:
        return None
    name, value = header
    return name if value is None else f"{name}={value}"


def show_form(queues: list[tuple[str, str]]) -> None:
    """The filter form; "Apply" applies it, or shows why it cannot."""
    labels = [ALL_QUEUES, *(f"{topic} / {group}" for topic, group in queues)]
    with st.form("filters"):
        first, second, third, fourth = st.columns(4)
        first.selectbox("Queue / group", labels, key=widget_key("queue"))
        second.selectbox("Status", STATUS_CHOICES, key=widget_key("status"))
        third.text_input("Error type", key=widget_key("error_type"))
        fourth.text_input("Error pattern", key=widget_key("error_pattern"))
        first.text_input("Reason contains", key=widget_key("reason"))
        second.text_input("Key", key=widget_key("key"))
        third.text_input("Text in value or error message", key=widget_key("search"))
        fourth.text_input("Header", placeholder="name=value, or name", key=widget_key("header"))
        first.text_input("Since", placeholder="2h, or 2026-11-23T10:00", key=widget_key("since"))
        second.text_input("Until", placeholder="30m, or an ISO time", key=widget_key("until"))
        submitted = st.form_submit_button("Apply filters", type="primary")
    if submitted:
        form = {name: st.session_state.get(widget_key(name)) for name in FIELDS}
        masker = config().masker
        where = attempt(lambda: filter_of(form, wall_clock_ms(), masker=masker))
        if where is not None:
            apply(where)


def apply_cause(error_type: str, error_pattern: str) -> None:
    """Filter by one cause: the form shows it, and it applies at once."""
    st.session_state[widget_key("error_type")] = error_type
    st.session_state[widget_key("error_pattern")] = error_pattern
    where = applied()
    apply(
        DeadLetterFilter(
            **{**vars(where), "error_type": error_type, "error_pattern": error_pattern}
        )
    )
