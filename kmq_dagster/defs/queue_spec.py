"""A queue as Dagster operates it: the :class:`Queue` value plus how it is processed and
watched. Every asset, check, job and sensor of a queue is named from one :class:`QueueSpec`.

Examples:
    >>> from kmq_dagster import Queue
    >>> spec = QueueSpec(Queue("orders", "pricing", partitions=2),
    ...                  function=lambda message: message.value, output_path="/tmp/priced")
    >>> spec.name, spec.queue_asset_key.to_user_string()
    ('orders__pricing', 'kmq/orders__pricing/queue')
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetKey, JobDefinition, OpDefinition, job

from kmq_dagster.core.breaker import BreakerConfig
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.queue_settings import PROCESSING_SETTINGS, QUEUE_SETTINGS, check_settings
from kmq_dagster.errors import ConfigError
from kmq_dagster.spark.concurrent_calls import check_concurrency

#: Seconds between backlog sensor ticks.
DEFAULT_BACKLOG_INTERVAL_S = 30
#: Seconds between observation sensor ticks.
DEFAULT_OBSERVATION_INTERVAL_S = 30
#: Longest a processing run keeps running batches before it ends (seconds).
DEFAULT_MAX_RUN_SECONDS = 600
#: Dead letters in the window above which ``dead_letters_not_growing`` warns. A dead-letter
#: queue exists so that a message that cannot be processed (a poison message, retries used up)
#: steps aside while the rest flows: one now and then is the DLQ doing its job, not something to
#: look at on call. Ten within the window is a pattern (a bad deploy, a producer sending a new
#: format); a mass failure is the circuit breaker's to catch, within seconds.
DEFAULT_DEAD_LETTER_THRESHOLD = 10
#: The window ``dead_letters_not_growing`` counts dead letters in (ms).
DEFAULT_DEAD_LETTER_WINDOW_MS = 15 * 60_000
#: Seconds between breaker sensor ticks.
DEFAULT_BREAKER_INTERVAL_S = 10
#: Seconds between tracker keep-alive ticks.
DEFAULT_KEEPALIVE_INTERVAL_S = 10
#: Dead letters a sensor tick copies into the audit store at most.
DEFAULT_INGEST_PER_TICK = 5_000

_NOT_A_NAME_CHARACTER = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class QueueSpec:
    """One queue declared for Dagster.

    Args:
        queue: the queue (topic, group, partitions, retry policy, visibility timeout, max
            redeliveries, value and key formats); provisioned with exactly these values. A
            ``function`` of a queue with a ``value_format`` gets messages whose
            ``decoded()`` gives the value decoded.
        function: called per message on the Spark executors (see :class:`SparkQueueJob`).
        transform: instead of ``function``, a DataFrame transform of each batch.
        output_path: the Parquet dataset the processing asset appends to.
        max_messages_per_partition: messages per partition and Spark batch.
        concurrency: calls of ``function`` at once per Spark task, for functions that wait on
            I/O (see :class:`SparkQueueJob`); 1 calls one at a time. Not for a ``transform``.
        ordering: with ``concurrency`` above 1, ``"key"``, ``"unordered"`` or ``"partition"``
            (one at a time per partition, the default); an :class:`Ordering` or its value.
        max_run_seconds: a processing run stops starting batches after this long.
        freshness_minutes: the output is expected processed within this many minutes of
            arrival: the output asset carries a Dagster freshness policy that fails once its
            last materialization is older; ``None``: no policy.
        backlog_interval_s: seconds between backlog sensor ticks.
        observation_interval_s: seconds between observation sensor ticks.
        dead_letter_threshold: ``dead_letters_not_growing`` warns above this many new dead
            letters within ``dead_letter_window_ms`` (default 10: a single dead letter is the
            DLQ doing its job; see :data:`DEFAULT_DEAD_LETTER_THRESHOLD`); 0 warns on every one.
        ingest_per_tick: dead letters the observation sensor stores per tick at most.
        breaker: when the breaker sensor opens the group's shared breaker, its cooldown and
            probes; ``None``: no breaker sensor.
        breaker_interval_s: seconds between breaker sensor ticks.
        keep_tracker: a keep-alive sensor keeps one tracker run of the queue going.
        keepalive_interval_s: seconds between keep-alive ticks.
        processing_cron: also process on this cron schedule (UTC), e.g. ``"0 * * * *"``.
        name: the Dagster name of the queue; default ``<topic>__<group>`` with every other
            character than letters, digits and ``_`` replaced by ``_``.
    """

    queue: Queue
    function: Callable[..., Any] | None = None
    transform: Callable[..., Any] | None = None
    output_path: str | None = None
    max_messages_per_partition: int = 50_000
    concurrency: int = 1
    ordering: Ordering | str = Ordering.PARTITION
    max_run_seconds: float = DEFAULT_MAX_RUN_SECONDS
    freshness_minutes: int | None = None
    backlog_interval_s: int = DEFAULT_BACKLOG_INTERVAL_S
    observation_interval_s: int = DEFAULT_OBSERVATION_INTERVAL_S
    dead_letter_threshold: int = DEFAULT_DEAD_LETTER_THRESHOLD
    dead_letter_window_ms: int = DEFAULT_DEAD_LETTER_WINDOW_MS
    ingest_per_tick: int = DEFAULT_INGEST_PER_TICK
    breaker: BreakerConfig | None = field(default_factory=BreakerConfig)
    breaker_interval_s: int = DEFAULT_BREAKER_INTERVAL_S
    keep_tracker: bool = True
    keepalive_interval_s: int = DEFAULT_KEEPALIVE_INTERVAL_S
    processing_cron: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.function is not None and self.transform is not None:
            raise ConfigError(f"queue {self.queue}: give a function or a transform, not both")
        if (self.function is not None or self.transform is not None) and not self.output_path:
            raise ConfigError(f"queue {self.queue}: processing needs an output_path")
        # the bounds of every setting (core/queue_settings.py)
        check_settings(self.queue, QUEUE_SETTINGS)  # declared here, so at most MAX_PARTITIONS
        check_settings(self, PROCESSING_SETTINGS, prefix=f"queue {self.queue}: ")
        try:
            ordering = check_concurrency(
                self.concurrency,
                self.ordering,
                function=self.function,
                transform=self.transform is not None,
            )
        except ConfigError as exc:
            raise ConfigError(f"queue {self.queue}: {exc}", setting=exc.setting) from None
        object.__setattr__(self, "ordering", ordering)
        if not self.name:
            default = f"{self.queue.topic}__{self.queue.group}"
            object.__setattr__(self, "name", _NOT_A_NAME_CHARACTER.sub("_", default))
        elif _NOT_A_NAME_CHARACTER.search(self.name):
            raise ConfigError(f"queue name {self.name!r}: use letters, digits and _ only")

    @property
    def processes(self) -> bool:
        """Whether Dagster processes this queue (a function or transform was given)."""
        return self.function is not None or self.transform is not None

    @property
    def queue_asset_key(self) -> AssetKey:
        """The queue itself, an observable asset."""
        return AssetKey(["kmq", self.name, "queue"])

    @property
    def output_asset_key(self) -> AssetKey:
        """The processed output (the Parquet dataset)."""
        return AssetKey(["kmq", self.name, "output"])

    def job_name(self, what: str) -> str:
        """``<what>_<name>``, e.g. ``process_orders__pricing``."""
        return f"{what}_{self.name}"

    @property
    def tags(self) -> dict[str, str]:
        """Tags every run of this queue carries."""
        return {"kmq/queue": self.queue.topic, "kmq/group": self.queue.group}


def check_unique_names(specs: Sequence[QueueSpec]) -> None:
    """Refuse two specs of one queue (topic and group), or with one Dagster name (``a.b``/``c``
    and ``a_b``/``c`` would clash).

    Raises:
        ConfigError: two specs declare one queue, or share a name; give one of them ``name=``.
    """
    seen: dict[str, QueueSpec] = {}
    queues: dict[tuple[str, str], QueueSpec] = {}
    for spec in specs:
        same_queue = queues.setdefault((spec.queue.topic, spec.queue.group), spec)
        if same_queue is not spec:
            raise ConfigError(f"queue {spec.queue} is declared twice: declare each queue once")
        other = seen.get(spec.name)
        if other is not None:
            raise ConfigError(
                f"queues {other.queue} and {spec.queue} both get the Dagster name {spec.name!r}; "
                "give one of them QueueSpec(name=...)"
            )
        seen[spec.name] = spec


def queue_job(
    spec: QueueSpec, what: str, op_def: OpDefinition, *, description: str
) -> JobDefinition:
    """The job ``<what>_<name>`` of ``spec``'s queue: the one op ``op_def``, its runs tagged
    with the queue (:attr:`QueueSpec.tags`) like every run of the queue."""

    @job(name=spec.job_name(what), description=description, tags=spec.tags)
    def the_job() -> None:
        op_def()

    return the_job
