"""The queue-definition options: ``kmq provision`` takes them, every other command refuses them.

A queue's definition (retries, visibility timeout, redeliveries, value and key formats) is
stored once by ``kmq provision``; the other commands read the stored one, so these options
live apart from the options every command shares (``kmq_dagster.cli.options``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.cli.options import gathered_options
from kmq_dagster.cli.setting_options import setting_option
from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.queue import (
    DEFAULT_MAX_REDELIVERIES,
    DEFAULT_RETRY_DELAYS_MS,
    DEFAULT_VISIBILITY_TIMEOUT_MS,
    Queue,
)
from kmq_dagster.core.queue_settings import NON_RETRYABLE, QUEUE_SETTINGS, RETRY_SETTINGS
from kmq_dagster.core.retry import DEFAULT_BACKOFF_ATTEMPTS, RetryPolicy
from kmq_dagster.settings import KmqSettings

#: The settings of a queue's definition the command line takes: ``kmq provision`` stores them,
#: every other command reads the stored ones and refuses these options.
DEFINITION_SETTINGS = (
    # which errors are fatal is the handler's business, not the stored definition's
    *(s for s in RETRY_SETTINGS if s.flag and s is not NON_RETRYABLE),
    *(s for s in QUEUE_SETTINGS if s.flag and s.name not in ("topic", "group", "partitions")),
)
#: Their options (see ``QUEUE_DEFINITION_HINT``).
QUEUE_DEFINITION_OPTIONS = tuple(str(setting.flag) for setting in DEFINITION_SETTINGS)
#: Why another command than ``provision`` refuses a queue-definition option.
QUEUE_DEFINITION_HINT = (
    "{option} is part of the queue's definition, which `kmq provision` stores and every other "
    "command reads; change it with `kmq provision --topic T --group G --redefine {option} ...`"
)


@dataclass(frozen=True)
class DefinitionOptions:
    """The queue-definition options of ``kmq provision`` that were given, by setting name
    (``visibility_timeout_ms``); a setting added to the model's tables comes along."""

    given: Mapping[str, Any] = field(default_factory=dict)

    def retry_policy(self, settings: KmqSettings) -> RetryPolicy | None:
        """The retry policy the options give, or ``None`` if none of them was given."""
        retry = {s.name: self.given[s.name] for s in RETRY_SETTINGS if s.name in self.given}
        return settings.retry_policy(**retry) if retry else None

    def new_queue(
        self, settings: KmqSettings, topic: str, group: str, partitions: int | None
    ) -> Queue:
        """The queue these options define, ``KMQ_*`` defaults for what is not given."""
        changes = {s.name: self.given[s.name] for s in QUEUE_SETTINGS if s.name in self.given}
        return settings.define_queue(
            topic,
            group,
            partitions=partitions,
            retry_policy=self.retry_policy(settings),
            visibility_timeout_ms=changes.pop("visibility_timeout_ms", None),
            max_redeliveries=changes.pop("max_redeliveries", None),
        ).replace(**changes)


#: What the help adds to a setting's phrase: where its default comes from.
_NOTES = {
    "delays": "[env KMQ_RETRY_DELAYS; default "
    + ",".join(format_duration_ms(delay_ms) for delay_ms in DEFAULT_RETRY_DELAYS_MS)
    + "]",
    "backoff": "Instead of --retry-delays.",
    "max_attempts": f"With --retry-backoff [default {DEFAULT_BACKOFF_ATTEMPTS}].",
    "jitter": "[default 0]",
    "visibility_timeout_ms": "[env KMQ_VISIBILITY_TIMEOUT; default "
    f"{format_duration_ms(DEFAULT_VISIBILITY_TIMEOUT_MS)}]",
    "max_redeliveries": f"[env KMQ_MAX_REDELIVERIES; default {DEFAULT_MAX_REDELIVERIES}]",
    "value_format": "[default bytes]",
    "key_format": "[default bytes]",
    "aux_partitions": "[default: half the queue's, rounded up]",
}


def _gather(*values: Any) -> DefinitionOptions:
    given = zip((setting.name for setting in DEFINITION_SETTINGS), values, strict=True)
    return DefinitionOptions({name: value for name, value in given if value is not None})


def definition_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the queue-definition options (``kmq provision``'s alone); the command receives
    ``definition``."""
    gather = gathered_options(
        "definition",
        _gather,
        tuple(flag.removeprefix("--").replace("-", "_") for flag in QUEUE_DEFINITION_OPTIONS),
        [setting_option(s, note=_NOTES.get(s.name, "")) for s in DEFINITION_SETTINGS],
    )
    return gather(command)
