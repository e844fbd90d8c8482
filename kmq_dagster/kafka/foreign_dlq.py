"""Opening a dead-letter topic another framework writes (a Spring DLT, say), checked once.

The handle is an :class:`~kmq_dagster.kafka.opened_queue.OpenedQueue` like any queue's, so
the DLQ ingester, ``kmq dlq``, replay and the console take it unchanged; its queue is a
:class:`~kmq_dagster.core.dead_letter_formats.ForeignDeadLetters`.

Examples:
    >>> opened = open_foreign_dlq(settings, "orders-dlt", "spring")      # doctest: +SKIP
    >>> opened.queue.dlq_topic, opened.queue.group                       # doctest: +SKIP
    ('orders-dlt', 'spring')
"""

from __future__ import annotations

from kmq_dagster.core.dead_letter_formats import FORMATS, KMQ, foreign_dead_letters
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.opened_queue import OpenedQueue, vouch_for
from kmq_dagster.kafka.provision import require_topics
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.settings import KmqSettings


def open_foreign_dlq(settings: KmqSettings, dlq_topic: str, dead_letter_format: str) -> OpenedQueue:
    """The dead-letter topic ``dlq_topic``, written in ``dead_letter_format``.

    Raises:
        ConfigError: an illegal topic name or an unknown format.
        ProvisionError: the topic does not exist.
        KafkaUnavailableError: the cluster did not answer.
    """
    source = foreign_dead_letters(dlq_topic, dead_letter_format)
    partitions = require_topics(
        settings, dlq_topic, [], fix=f"check the name: no topic {dlq_topic} on this cluster"
    )
    return vouch_for(settings, source.replace(partitions=partitions))


def open_dead_letters(
    settings: KmqSettings,
    *,
    topic: str | None = None,
    group: str | None = None,
    dlq_topic: str | None = None,
    dead_letter_format: str = KMQ,
) -> OpenedQueue:
    """A queue's DLQ (``topic`` and ``group``) or a dead-letter topic named by itself
    (``dlq_topic``, in ``dead_letter_format``): what ``kmq ingest``, ``kmq replay`` and the
    Dagster ingest job read.

    Raises:
        ConfigError: neither or both given, or a format without ``dlq_topic``.
        As :func:`open_foreign_dlq` and :func:`~kmq_dagster.kafka.queues.open_queue`.
    """
    if dlq_topic is not None:
        if topic is not None or group is not None:
            raise ConfigError(
                "name the dead letters by --topic and --group (a kmq queue) or by --dlq-topic "
                "(a dead-letter topic of its own), not both",
                setting="dlq_topic",
            )
        return open_foreign_dlq(settings, dlq_topic, dead_letter_format)
    if topic is None or group is None:
        raise ConfigError(
            "name the dead letters by --topic and --group (a kmq queue) or by --dlq-topic "
            "with --format (a dead-letter topic another framework writes)",
            setting="topic",
        )
    if dead_letter_format != KMQ:
        raise ConfigError(
            f"a kmq queue's DLQ holds kmq dead letters; give --dlq-topic to read a "
            f"{dead_letter_format} dead-letter topic",
            setting="format",
        )
    return open_queue(settings, topic, group)


def open_stored_dead_letters(
    settings: KmqSettings, queue_topic: str, group_id: str, dlq_topic: str
) -> OpenedQueue:
    """The dead letters the audit store keeps under ``queue_topic`` / ``group_id``, read from
    ``dlq_topic``: a foreign dead-letter topic's (stored as ``<dlq topic> / <format>``, see
    :class:`~kmq_dagster.core.dead_letter_formats.ForeignDeadLetters`), else a kmq queue's.

    Raises:
        As :func:`open_dead_letters`.
    """
    if dlq_topic == queue_topic and group_id in FORMATS:
        return open_foreign_dlq(settings, queue_topic, group_id)
    return open_queue(settings, queue_topic, group_id)
