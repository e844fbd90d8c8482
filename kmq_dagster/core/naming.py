"""Names of the topics that make up one queue (the one place these names are built)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from kmq_dagster.core.durations import format_duration_ms, is_duration, parse_duration_ms
from kmq_dagster.errors import ConfigError

#: Kafka's limit on topic name length.
MAX_TOPIC_NAME_LENGTH = 249

_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]+")


def validate_topic_name(name: str) -> str:
    """Return ``name`` if Kafka accepts it as a topic name.

    Raises:
        ConfigError: empty, ``.``/``..``, too long, or a character outside ``[A-Za-z0-9._-]``.
    """
    if name in {"", ".", ".."}:
        raise ConfigError(f"illegal topic name {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise ConfigError(
            f"topic name {name[:40]!r}... is {len(name)} characters; Kafka allows "
            f"{MAX_TOPIC_NAME_LENGTH}"
        )
    if not _LEGAL_TOPIC.fullmatch(name):
        raise ConfigError(
            f"illegal topic name {name!r}: only letters, digits, '.', '_' and '-' are allowed"
        )
    return name


def markers_topic(topic: str, group: str) -> str:
    """The markers topic of ``group`` consuming ``topic``: ``<topic>.<group>.markers``."""
    return validate_topic_name(f"{topic}.{group}.markers")


def redelivery_topic(topic: str, group: str) -> str:
    """Where the tracker re-produces overdue messages for ``group`` only."""
    return validate_topic_name(f"{topic}.{group}.redelivery")


def retry_topic(topic: str, group: str, delay_ms: int) -> str:
    """The retry topic for one delay, e.g. ``orders.billing.retry.5m``."""
    return validate_topic_name(f"{topic}.{group}.retry.{format_duration_ms(delay_ms)}")


def dlq_topic(topic: str, group: str) -> str:
    """The dead-letter topic of ``group`` consuming ``topic``: ``<topic>.<group>.dlq``."""
    return validate_topic_name(f"{topic}.{group}.dlq")


def delay_topic(topic: str, level_ms: int) -> str:
    """The delay-level topic of ``topic`` for one level, e.g. ``orders.delay.30s``."""
    return validate_topic_name(f"{topic}.delay.{format_duration_ms(level_ms)}")


def delay_dlq_topic(topic: str) -> str:
    """Where delayed messages with unreadable delay headers go: ``<topic>.delay.dlq``."""
    return validate_topic_name(f"{topic}.delay.dlq")


def delay_topics(topic: str, levels_ms: Sequence[int]) -> list[str]:
    """The delay queue's topics of ``topic``: one per level, then its DLQ."""
    return [*(delay_topic(topic, level_ms) for level_ms in levels_ms), delay_dlq_topic(topic)]


def delay_levels_of(topic: str, names: Iterable[str]) -> tuple[int, ...]:
    """The delay levels (ms, ascending) whose level topics of ``topic`` are among ``names``.

    A level topic is ``<topic>.delay.<duration>`` with the duration written as
    :func:`delay_topic` writes it; the delay DLQ and other names are not levels.
    """
    prefix = f"{topic}.delay."
    levels_ms = set()
    for name in names:
        suffix = name[len(prefix) :] if name.startswith(prefix) else ""
        if not (suffix[:1].isdigit() and is_duration(suffix)):
            continue
        try:
            level_ms = parse_duration_ms(suffix)
        except ConfigError:  # longer than any duration: not a level kmq made
            continue
        if level_ms > 0 and format_duration_ms(level_ms) == suffix:
            levels_ms.add(level_ms)
    return tuple(sorted(levels_ms))


def group_topics(topic: str, group: str, retry_delays_ms: list[int]) -> list[str]:
    """Every topic a group needs besides the queue topic itself, in a stable order."""
    distinct_delays_ms = sorted(set(retry_delays_ms))
    return [
        markers_topic(topic, group),
        redelivery_topic(topic, group),
        *(retry_topic(topic, group, delay_ms) for delay_ms in distinct_delays_ms),
        dlq_topic(topic, group),
    ]
