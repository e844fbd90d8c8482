"""Health checks of a queue, decided from figures: what Dagster shows as asset checks, and
what ``kmq status`` and the console may show too.

Examples:
    >>> breaker_closed("open", opened_at_ms=1_000).passed
    False
    >>> dead_letters_not_growing(3, threshold=5, window_ms=60_000).passed
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.readable import duration_text
from kmq_dagster.core.wording import counted

#: Names of the checks (Dagster asset check names).
DEAD_LETTERS_NOT_GROWING = "dead_letters_not_growing"
OLDEST_UNACKED_AGE = "oldest_unacked_age"
BREAKER_CLOSED = "breaker_closed"
OUTPUT_MATCHES_ACKS = "output_matches_acks"

WARN = "WARN"
ERROR = "ERROR"

Figure = int | float | str | None


@dataclass(frozen=True)
class CheckOutcome:
    """One check's verdict: passed or not, how bad if not, why, and the figures."""

    name: str
    passed: bool
    severity: str
    description: str
    figures: dict[str, Figure] = field(default_factory=dict)


def dead_letters_not_growing(new_in_window: int, *, threshold: int, window_ms: int) -> CheckOutcome:
    """WARN when more than ``threshold`` dead letters arrived within the last ``window_ms``."""
    passed = new_in_window <= threshold
    verdict = "at most" if passed else "more than"
    return CheckOutcome(
        DEAD_LETTERS_NOT_GROWING,
        passed,
        WARN,
        f"{counted(new_in_window, 'new dead letter')} in the last {duration_text(window_ms)} "
        f"({verdict} {threshold} allowed)",
        {"new_dead_letters": new_in_window, "threshold": threshold, "window_ms": window_ms},
    )


def oldest_unacked_age(
    age_ms: int | None, *, visibility_timeout_ms: int, max_redeliveries: int
) -> CheckOutcome:
    """ERROR when a message has been unacknowledged for longer than every delivery the queue
    allows it (visibility timeout x (max redeliveries + 1)): the tracker is not redelivering or
    dead-lettering it, so it is not doing its job (is one running?)."""
    limit_ms = visibility_timeout_ms * (max_redeliveries + 1)
    passed = age_ms is None or age_ms <= limit_ms
    shown = "nothing in flight" if age_ms is None else f"oldest {format_duration_ms(age_ms)}"
    detail = "" if passed else ": is a redelivery tracker running for this group?"
    return CheckOutcome(
        OLDEST_UNACKED_AGE,
        passed,
        ERROR,
        f"unacknowledged: {shown}; limit {format_duration_ms(limit_ms)}{detail}",
        {"oldest_unacked_age_ms": age_ms, "limit_ms": limit_ms},
    )


def breaker_closed(
    state: str, *, opened_at_ms: int | None = None, cooldown_ms: int | None = None
) -> CheckOutcome:
    """ERROR while the group's circuit breaker is open or probing."""
    passed = state in ("closed", "unknown")
    description = f"circuit breaker {state.replace('_', '-')}"
    if not passed and opened_at_ms is not None:
        description += f" since {format_epoch_ms(opened_at_ms)}"
        if cooldown_ms is not None:
            description += f", probing after {format_duration_ms(cooldown_ms)}"
    return CheckOutcome(
        BREAKER_CLOSED,
        passed,
        ERROR,
        description,
        {"state": state, "opened_at_ms": opened_at_ms, "cooldown_ms": cooldown_ms},
    )


def output_matches_acks(
    rows: int, distinct_rows: int, acknowledged: int, *, exact: bool
) -> CheckOutcome:
    """A run's output rows against the messages it acknowledged as processed (invariant 3:
    acknowledged only after the output is written). With a per-message function (``exact``)
    every acknowledged message has its row, so rows must equal acknowledged messages; a
    DataFrame transform may filter or add rows, so only the deduplicated rows are compared,
    and they may not exceed the acknowledged messages. Rows that share (topic, partition,
    offset) are duplicates (at-least-once, e.g. after a rebalance): counted, never hidden."""
    duplicates = rows - distinct_rows
    if exact:
        passed = rows == acknowledged
        verdict = "equal" if passed else "differ from"
        description = f"{rows} output rows {verdict} {acknowledged} acknowledged messages"
    else:
        passed = distinct_rows <= acknowledged
        verdict = "at most" if passed else "more than"
        description = f"{distinct_rows} distinct output rows, {verdict} {acknowledged} acknowledged"
    return CheckOutcome(
        OUTPUT_MATCHES_ACKS,
        passed,
        ERROR,
        f"{description}; {distinct_rows} distinct by (topic, partition, offset), "
        f"{duplicates} duplicates",
        {
            "rows": rows,
            "distinct_rows": distinct_rows,
            "duplicates": duplicates,
            "acknowledged": acknowledged,
        },
    )


def format_epoch_ms(epoch_ms: int) -> str:
    """``epoch_ms`` as a UTC time a person reads, e.g. ``2026-11-23 19:40:01 UTC``."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
