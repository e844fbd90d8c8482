"""What every ``kmq bench`` shares: where to report, which Kafka to use, percentiles."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from kmq_dagster.kafka.clients import new_producer
from kmq_dagster.kafka.delivery import produce
from kmq_dagster.settings import KmqSettings

#: Payload of every benchmark message (the mqperf benchmark used 100 bytes too).
VALUE = b"x" * 100

#: Prints one progress line (to stderr: stdout's last line is the JSON figures).
Report = Callable[[str], None]
#: Gives the Kafka to measure on, for the length of one measurement.
Cluster = Callable[[], AbstractContextManager[KmqSettings]]


def percentile(values: list[float], share: float) -> float:
    """The value below which ``share`` of ``values`` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def fill_topic(settings: KmqSettings, topic: str, count: int, partitions: int) -> None:
    """Produce ``count`` 100-byte messages round-robin over ``partitions`` and wait for acks."""
    producer = new_producer(settings, **{"linger.ms": 20})
    for i in range(count):
        produce(producer, topic, value=VALUE, partition=i % partitions)
    producer.flush(120)


def rotated(names: list[str], round_number: int) -> list[str]:
    """``names`` starting at the ``round_number``-th (from 1), wrapping round: no run of a
    benchmark may profit from always going first (or last) on a fresh broker."""
    shift = (round_number - 1) % len(names)
    return names[shift:] + names[:shift]
