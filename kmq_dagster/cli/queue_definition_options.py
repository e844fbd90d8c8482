"""The queue-definition options: ``kmq provision`` takes them, every other command refuses them.

A queue's definition (retries, visibility timeout, redeliveries, value and key formats) is
stored once by ``kmq provision``; the other commands read the stored one, so these options
live apart from the options every command shares (``kmq_dagster.cli.options``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from kmq_dagster.cli.options import gathered_options
from kmq_dagster.cli.value_types import Duration, Number
from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.queue import (
    DEFAULT_MAX_REDELIVERIES,
    DEFAULT_RETRY_DELAYS_MS,
    DEFAULT_VISIBILITY_TIMEOUT_MS,
    Queue,
)
from kmq_dagster.core.retry import DEFAULT_BACKOFF_ATTEMPTS, RetryPolicy
from kmq_dagster.core.value_formats import ValueFormat
from kmq_dagster.settings import MAX_PARTITIONS, KmqSettings

#: The options of a queue's definition: ``kmq provision`` stores it, every other command reads
#: the stored one and refuses these (see ``QUEUE_DEFINITION_HINT``).
QUEUE_DEFINITION_OPTIONS = (
    "--retry-delays",
    "--retry-backoff",
    "--max-attempts",
    "--retry-jitter",
    "--visibility-timeout",
    "--max-redeliveries",
    "--value-format",
    "--key-format",
    "--aux-partitions",
)
#: Why another command than ``provision`` refuses a queue-definition option.
QUEUE_DEFINITION_HINT = (
    "{option} is part of the queue's definition, which `kmq provision` stores and every other "
    "command reads; change it with `kmq provision --topic T --group G --redefine {option} ...`"
)


@dataclass(frozen=True)
class DefinitionOptions:
    """The queue-definition options of ``kmq provision``, ``None`` where not given."""

    delays: str | None
    backoff: str | None
    max_attempts: int | None
    jitter: float | None
    visibility_timeout_ms: int | None
    max_redeliveries: int | None
    value_format: str | None = None
    key_format: str | None = None
    aux_partitions: int | None = None

    def retry_policy(self, settings: KmqSettings) -> RetryPolicy | None:
        """The retry policy the options give, or ``None`` if none of them was given."""
        if (self.delays, self.backoff, self.max_attempts, self.jitter) == (None,) * 4:
            return None
        return settings.retry_policy(
            delays=self.delays,
            backoff=self.backoff,
            max_attempts=self.max_attempts,
            jitter=self.jitter,
        )

    def new_queue(
        self, settings: KmqSettings, topic: str, group: str, partitions: int | None
    ) -> Queue:
        """The queue these options define, ``KMQ_*`` defaults for what is not given."""
        changes: dict[str, Any] = {
            name: given
            for name, given in (
                ("value_format", self.value_format),
                ("key_format", self.key_format),
            )
            if given is not None
        }
        if self.aux_partitions is not None:
            changes["aux_partitions"] = self.aux_partitions
        return settings.define_queue(
            topic,
            group,
            partitions=partitions,
            retry_policy=self.retry_policy(settings),
            visibility_timeout_ms=self.visibility_timeout_ms,
            max_redeliveries=self.max_redeliveries,
        ).replace(**changes)


def definition_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the queue-definition options (``kmq provision``'s alone); the command receives
    ``definition``."""

    names = ("retry_delays", "retry_backoff", "max_attempts", "retry_jitter",
             "visibility_timeout", "max_redeliveries", "value_format", "key_format",
             "aux_partitions")  # fmt: skip
    return gathered_options(
        "definition",
        DefinitionOptions,
        names,
        [
            click.option(
                "--retry-delays",
                metavar="LIST",
                help="Delay before each retry, one retry topic per distinct delay, e.g. "
                f"10s,1m,10m [env KMQ_RETRY_DELAYS; default {_delays(DEFAULT_RETRY_DELAYS_MS)}].",
            ),
            click.option(
                "--retry-backoff",
                metavar="INITIAL,MULTIPLIER,MAX",
                help="Exponential backoff instead of --retry-delays, e.g. 1s,2,10m.",
            ),
            click.option(
                "--max-attempts",
                type=click.IntRange(1, 1000),
                help=f"Attempts in all with --retry-backoff [default {DEFAULT_BACKOFF_ATTEMPTS}].",
            ),
            click.option(
                "--retry-jitter",
                type=Number(0, 1, high_open=True),
                help="Spread each due time by up to this share of its delay [default 0].",
            ),
            click.option(
                "--visibility-timeout",
                type=Duration(),
                metavar="DURATION",
                help="Redeliver a message not acknowledged within this time, 1ms to 7d "
                "[env KMQ_VISIBILITY_TIMEOUT; default "
                f"{format_duration_ms(DEFAULT_VISIBILITY_TIMEOUT_MS)}].",
            ),
            click.option(
                "--max-redeliveries",
                type=click.IntRange(0, 1000),
                help="Redeliveries before the DLQ [env KMQ_MAX_REDELIVERIES; default "
                f"{DEFAULT_MAX_REDELIVERIES}].",
            ),
            click.option(
                "--value-format",
                type=click.Choice([f.value for f in ValueFormat]),
                help="How the values are encoded; avro, protobuf and json-schema are in the "
                "Schema Registry wire format, decoded by message.decoded() with the registry "
                "of KMQ_SCHEMA_REGISTRY_URL [default bytes].",
            ),
            click.option(
                "--key-format",
                type=click.Choice([f.value for f in ValueFormat]),
                help="How the keys are encoded, as --value-format [default bytes].",
            ),
            click.option(
                "--aux-partitions",
                type=click.IntRange(1, MAX_PARTITIONS),
                help="Partitions of the group's redelivery, retry and DLQ topics, at most the "
                "queue's; the markers topic always has the queue's [default: half the "
                "queue's, rounded up].",
            ),
        ],
    )(command)


def _delays(delays_ms: tuple[int, ...]) -> str:
    return ",".join(format_duration_ms(delay_ms) for delay_ms in delays_ms)
