"""Every setting of a queue and of its processing, described once: its name, kind, bounds,
help text, and the one check of its bounds (defaults are the Python classes').

The Python API (:class:`~kmq_dagster.Queue`, :class:`~kmq_dagster.defs.QueueSpec`,
:class:`~kmq_dagster.BreakerConfig`, :class:`~kmq_dagster.RetryPolicy`), the Component's
``defs.yaml`` schema (``kmq_dagster.components.queue_model``) and the ``kmq`` command's options
(``kmq_dagster.cli.setting_options``) are built from these tables, so a value is refused by the
same rule with the same words wherever it is given: adding a setting to a queue is one row here
plus its use.

Examples:
    >>> PARTITIONS.refusal(0)
    'is not in [1, 1000]'
    >>> setting_named("visibility_timeout_ms").yaml_key, setting_named("visibility_timeout_ms").flag
    ('visibility_timeout', '--visibility-timeout')
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kmq_dagster.core.durations import format_duration_ms, parse_duration_ms
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.value_formats import ValueFormat
from kmq_dagster.errors import ConfigError

#: Most partitions ``kmq provision`` gives new topics. The queue and markers topics (and the
#: delay levels) get that many, the redelivery, retry and DLQ topics half by default, so 1,000
#: is already 4,500 partitions with 3 retry delays and 13,500 with the delay queue: up to three
#: brokers' worth at Kafka's guidance of about 4,000 per broker, and on the embedded broker
#: seconds per metadata request. (100,000 took the embedded broker to 2.1 GB and made it
#: unreachable.) Larger topics can still be created with Kafka's own tools; kmq adopts their
#: partition count.
MAX_PARTITIONS = 1_000
#: Most handler calls at once (``concurrency``).
MAX_CONCURRENCY = 1024
#: Longest visibility timeout: a week (a longer one hides a stuck message for too long).
MAX_VISIBILITY_TIMEOUT_MS = 7 * 86_400_000
#: Most redeliveries of one message, and most attempts of a backoff, before the DLQ.
MAX_TRIES = 1000
#: A visibility timeout shorter than this is accepted with a warning: an acknowledgement
#: reaches the markers topic tens of milliseconds after ``ack()`` (the end markers of a worker
#: are written every 50 ms) and the tracker reads it after that, so a message acknowledged in
#: time may still be redelivered (a duplicate, never a loss).
SHORT_VISIBILITY_TIMEOUT_MS = 1_000


class Kind(enum.StrEnum):
    """What a setting's value is, which decides how a front end takes it."""

    INT = "int"
    #: A finite float.
    NUMBER = "number"
    #: Milliseconds in Python, text such as ``30s`` in YAML and on the command line.
    DURATION = "duration"
    #: One of :attr:`Setting.choices`.
    CHOICE = "choice"
    TEXT = "text"
    #: Several texts: a YAML list, a comma-separated option.
    TEXTS = "texts"
    FLAG = "flag"
    #: A callable in Python, its import path (``pkg.module.name``) in YAML and on the command line.
    CALLABLE = "callable"
    #: A group of settings of its own (:attr:`Setting.members`): the retry policy, the breaker.
    GROUP = "group"


@dataclass(frozen=True)
class Setting:
    """One setting: how every front end names, takes and checks it.

    Args:
        name: the keyword of the Python API (``visibility_timeout_ms``).
        kind: what the value is.
        help: one phrase for the YAML schema's description and the option's help.
        low, high: the bounds (``None``: none), inclusive unless ``low_open``/``high_open``.
        choices: the values of a :attr:`Kind.CHOICE`.
        flag: the ``kmq`` option (``None``: the command line does not take it).
        key: the ``defs.yaml`` key; default: ``name`` without a trailing ``_ms``.
        owner: how error texts name the object the setting belongs to (``breaker``).
        default_note: what the default is, where the Python default (``None``) does not say
            it, e.g. ``half the queue's, rounded up``.
        required: the queue cannot be declared without it.
        members: the settings of a :attr:`Kind.GROUP`.
        extra: a word YAML takes besides the value (``auto``), or ``""``.
        off: YAML's ``false`` (Python's ``None``) turns it off.
    """

    name: str
    kind: Kind
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    flag: str | None = None
    key: str = ""
    owner: str = ""
    default_note: str = ""
    required: bool = False
    members: tuple[Setting, ...] = ()
    extra: str = ""
    off: bool = False

    @property
    def yaml_key(self) -> str:
        """The key of this setting in a ``defs.yaml`` queue."""
        return self.key or self.name.removesuffix("_ms")

    @property
    def label(self) -> str:
        """How error texts of the Python API name it, e.g. ``breaker window_ms``."""
        return f"{self.owner} {self.name}" if self.owner else self.name

    @property
    def bounded(self) -> bool:
        return self.low is not None or self.high is not None

    def bounds(self) -> str:
        """The accepted range in words, e.g. ``[1, 1000]``, ``1ms to 7d``, ``at least 1``."""
        low, high = self.low, self.high
        if self.kind is Kind.DURATION:
            return f"{format_duration_ms(int(low or 1))} to {format_duration_ms(int(high or 1))}"
        if self.kind is Kind.INT and high is None:
            return f"at least {_number(low or 0)}"
        opening = "(" if self.low_open else "["
        closing = ")" if self.high_open else "]"
        shown_low = "-inf" if low is None else _number(low)
        shown_high = "inf" if high is None else _number(high)
        return f"{opening}{shown_low}, {shown_high}{closing}"

    def refusal(self, value: float) -> str | None:
        """Why ``value`` (milliseconds for a duration) is out of bounds, as a phrase for any
        front end to put after the value it was given (``is not in (0, 1]``); ``None``: fine.

        The one check of this setting's bounds: NaN and infinities are out of every bound.
        """
        if not self.bounded:
            return None
        if not math.isfinite(value):
            return self._out_of_bounds()
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return None if low_ok and high_ok else self._out_of_bounds()

    def _out_of_bounds(self) -> str:
        if self.kind is Kind.DURATION:
            return f"is outside {self.bounds()}"
        if self.kind is Kind.INT and self.high is None:
            return f"is less than {_number(self.low or 0)}"
        return f"is not in {self.bounds()}"

    def refused(self, given: Any) -> str | None:
        """Why a given value is refused, quoted as given (``0 is not in [1, 1000]``,
        ``'0s' is outside 1ms to 7d``); ``None``: accepted. The one check every front end
        uses: the Python API gives numbers (milliseconds for a duration), YAML and the command
        line may give text.

        Raises:
            ConfigError: a text that is no value of this kind at all (``'ten'``).
        """
        if given is None or not self.bounded or given == self.extra:
            return None
        value = self._value_of(given) if isinstance(given, str) else given
        phrase = self.refusal(value)
        if phrase is None:
            return None
        shown = given if isinstance(given, str) and self.kind is Kind.INT else repr(given)
        return f"{shown} {phrase}"

    def check(self, value: Any) -> None:
        """Refuse a value of the Python API out of bounds (``None``: not given).

        Raises:
            ConfigError: out of bounds; ``setting`` is :attr:`name`.
        """
        why = self.refused(value)
        if why is not None:
            raise ConfigError(f"{self.label}: {why}", setting=self.name)

    def parse(self, text: str) -> Any:
        """The value ``text`` (YAML's or the command line's) gives, checked.

        Raises:
            ConfigError: not a value of this kind, or out of bounds (the text is quoted).
        """
        why = self.refused(text)
        if why is not None:
            raise ConfigError(why, setting=self.name)
        return self._value_of(text) if self.bounded else text

    def _value_of(self, text: str) -> Any:
        if self.kind is Kind.DURATION:
            return parse_duration_ms(text)
        try:
            return int(text) if self.kind is Kind.INT else float(text)
        except ValueError:
            word = "a whole number" if self.kind is Kind.INT else "a number"
            raise ConfigError(f"{text!r} is not {word}", setting=self.name) from None


def check_settings(
    target: object,
    settings: tuple[Setting, ...],
    prefix: str = "",
    *,
    low_only: tuple[str, ...] = (),
) -> None:
    """Check the bounds of every setting of ``settings`` that ``target`` has as an attribute.

    Args:
        prefix: starts the message, e.g. ``queue orders / g: ``.
        low_only: names checked against their lower bound only (a queue opened on topics
            created with Kafka's own tools may have more partitions than kmq creates).

    Raises:
        ConfigError: the first value out of bounds.
    """
    for setting in settings:
        value = getattr(target, setting.name, None)
        if setting.name in low_only and setting.high is not None and _above(value, setting.high):
            continue
        try:
            setting.check(value)
        except ConfigError as exc:
            raise ConfigError(f"{prefix}{exc}", setting=exc.setting) from None


def short_visibility_warning(visibility_timeout_ms: int) -> str | None:
    """The warning for a visibility timeout under :data:`SHORT_VISIBILITY_TIMEOUT_MS`;
    ``None`` for a longer one."""
    if visibility_timeout_ms >= SHORT_VISIBILITY_TIMEOUT_MS:
        return None
    return (
        f"a visibility timeout of {format_duration_ms(visibility_timeout_ms)} leaves little "
        "time for an acknowledgement to reach the tracker (tens of ms, seconds on a loaded "
        "machine): messages acknowledged in time may be redelivered; give it a few seconds at "
        "least"
    )


def _number(value: float) -> str:
    """``1000`` for a whole number (never ``1e+03``), else as written (``0.5``, ``inf``)."""
    return str(int(value)) if math.isfinite(value) and value == int(value) else f"{value:g}"


def _above(value: Any, high: float) -> bool:
    return isinstance(value, int | float) and value > high


def _int(name: str, help: str, low: int, high: int | None = None, **more: Any) -> Setting:
    return Setting(name, Kind.INT, help, low=low, high=high, **more)


def _duration(name: str, help: str, **more: Any) -> Setting:
    """A duration of 1 ms to a week: every duration of a queue's settings."""
    return Setting(name, Kind.DURATION, help, low=1, high=MAX_VISIBILITY_TIMEOUT_MS, **more)


NON_RETRYABLE = Setting("non_retryable", Kind.TEXTS, "exception type names that go to the DLQ "
                        "at once, e.g. ValueError,KeyError", flag="--non-retryable")  # fmt: skip

# -- the retry policy (``Queue.retry_policy``; YAML ``retry:``; ``kmq provision --retry-*``) ----

RETRY_SETTINGS: tuple[Setting, ...] = (
    Setting("delays", Kind.TEXTS, "one retry per delay, e.g. 10s,1m,10m", flag="--retry-delays"),
    Setting("backoff", Kind.TEXT, "exponential backoff INITIAL,MULTIPLIER,MAX instead of "
            "delays, e.g. 1s,2,10m", flag="--retry-backoff"),
    _int("max_attempts", "attempts in all with a backoff (the first included)", 1, MAX_TRIES,
         flag="--max-attempts"),
    Setting("jitter", Kind.NUMBER, "spread each due time by up to this share of its delay",
            low=0, high=1, high_open=True, flag="--retry-jitter", owner="retry"),
    NON_RETRYABLE,
)  # fmt: skip

# -- the circuit breaker (``BreakerConfig``; YAML ``breaker:``; ``kmq worker --breaker-*``) ----

BREAKER_SETTINGS: tuple[Setting, ...] = (
    _duration("window_ms", "the sliding window the error rate is measured over",
              flag="--breaker-window", owner="breaker"),
    _int("min_calls", "calls in the window before the rate counts", 1, 1_000_000,
         flag="--breaker-min-calls", owner="breaker"),
    Setting("error_rate", Kind.NUMBER, "failed share of calls in the window that opens it",
            low=0, high=1, low_open=True, flag="--breaker-error-rate", owner="breaker"),
    _int("consecutive_failures", "failures in a row that open it", 1, 1_000_000,
         owner="breaker"),
    _duration("cooldown_ms", "how long it stays open at first (multiplied per failed probe, "
              "up to the longest)", flag="--breaker-cooldown",
              owner="breaker"),
    Setting("cooldown_multiplier", Kind.NUMBER, "growth of the cooldown per failed probe",
            low=1, high=math.inf, high_open=True, owner="breaker"),
    _duration("max_cooldown_ms", "the longest it stays open", owner="breaker",
              default_note="5m or the cooldown, the longer"),
    _int("probes", "messages let through to test recovery", 1, MAX_TRIES,
         flag="--breaker-probes", owner="breaker"),
)  # fmt: skip

# -- the queue (``Queue``; ``kmq provision``) ----------------------------------------------------

PARTITIONS = _int("partitions", "partitions of the queue topic and its markers topic (kmq "
                  f"creates topics of at most {MAX_PARTITIONS:,}; a queue on larger topics made "
                  "with Kafka's own tools adopts their count)", 1, MAX_PARTITIONS,
                  flag="--partitions")  # fmt: skip
VALUE_FORMATS = tuple(f.value for f in ValueFormat)

QUEUE_SETTINGS: tuple[Setting, ...] = (
    Setting("topic", Kind.TEXT, "the queue topic producers write to", flag="--topic",
            required=True),
    Setting("group", Kind.TEXT, "the consumer group working it", flag="--group", required=True),
    PARTITIONS,
    _int("aux_partitions", "partitions of the group's redelivery, retry and DLQ topics, at "
         "most the queue's (the markers topic always has the queue's)", 1, MAX_PARTITIONS,
         flag="--aux-partitions", default_note="half the queue's, rounded up"),
    Setting("retry_policy", Kind.GROUP, "when a failed message is retried", key="retry",
            members=RETRY_SETTINGS, default_note="10s, 1m, 10m"),
    _duration("visibility_timeout_ms", "a message not acknowledged within this time is "
              f"redelivered (under {format_duration_ms(SHORT_VISIBILITY_TIMEOUT_MS)}: accepted, "
              "with a warning that acknowledged messages may be redelivered)",
              flag="--visibility-timeout"),
    _int("max_redeliveries", "redeliveries of one message before the DLQ", 0, MAX_TRIES,
         flag="--max-redeliveries"),
    Setting("value_format", Kind.CHOICE, "how the values are encoded; avro, protobuf and "
            "json-schema are in the Schema Registry wire format, decoded by message.decoded() "
            "with the registry of KMQ_SCHEMA_REGISTRY_URL", choices=VALUE_FORMATS,
            flag="--value-format"),
    Setting("key_format", Kind.CHOICE, "how the keys are encoded, as value_format",
            choices=VALUE_FORMATS, flag="--key-format"),
)  # fmt: skip

# -- its processing (``QueueSpec``; ``kmq spark``/``kmq worker``) ------------------------------

CONCURRENCY = _int("concurrency", "handler calls at once", 1, MAX_CONCURRENCY,
                   flag="--concurrency")  # fmt: skip
ORDERING = Setting("ordering", Kind.CHOICE, "what concurrent calls keep in order: one call per "
                   "partition at a time, never two of one key at once, or nothing",
                   choices=tuple(o.value for o in Ordering), flag="--ordering")  # fmt: skip


def _interval(name: str, what: str) -> Setting:
    return _int(name, f"seconds between {what} ticks", 1)


PROCESSING_SETTINGS: tuple[Setting, ...] = (
    Setting("function", Kind.CALLABLE, "import path of the per-message function, e.g. "
            "pkg.mod.fn", flag="--function"),
    Setting("transform", Kind.CALLABLE, "instead of function: import path of a DataFrame "
            "transform"),
    Setting("output_path", Kind.TEXT, "the Parquet dataset the results are appended to",
            flag="--output"),
    _int("max_messages_per_partition", "messages per partition and Spark batch at most", 1,
         10_000_000, flag="--max-per-partition"),
    CONCURRENCY,
    ORDERING,
    Setting("max_run_seconds", Kind.NUMBER, "a processing run stops starting batches after "
            "this many seconds", low=0, high=math.inf, low_open=True, high_open=True),
    _int("freshness_minutes", "the output is processed within this many minutes of arrival "
         "(a Dagster freshness policy); auto: from backlog_interval_s and max_run_seconds", 1,
         extra="auto"),
    _interval("backlog_interval_s", "backlog sensor"),
    _interval("observation_interval_s", "observation sensor"),
    _int("dead_letter_threshold", "new dead letters allowed in the window before the check "
         "warns", 0),
    _duration("dead_letter_window_ms", "the window new dead letters are counted in"),
    _int("ingest_per_tick", "dead letters the observation sensor stores per tick at most", 1),
    Setting("breaker", Kind.GROUP, "when the breaker sensor opens the group's breaker; false: "
            "no breaker sensor", members=BREAKER_SETTINGS, off=True),
    _interval("breaker_interval_s", "breaker sensor"),
    Setting("keep_tracker", Kind.FLAG, "a keep-alive sensor keeps one tracker run going"),
    _interval("keepalive_interval_s", "tracker keep-alive sensor"),
    Setting("processing_cron", Kind.TEXT, "also process on this cron schedule (UTC)"),
    Setting("name", Kind.TEXT, "the Dagster name", default_note="`<topic>__<group>`"),
)  # fmt: skip

#: Every setting of a queue declared for Dagster, the queue's first.
QUEUE_SPEC_SETTINGS = QUEUE_SETTINGS + PROCESSING_SETTINGS


def all_settings() -> Iterator[Setting]:
    """Every setting, those of a group's members included."""
    for setting in QUEUE_SPEC_SETTINGS:
        yield setting
        yield from setting.members


def setting_named(name: str, table: tuple[Setting, ...] | None = None) -> Setting:
    """The setting ``name`` of ``table`` (default: the queue's and its processing's).

    Raises:
        KeyError: no such setting.
    """
    for setting in table if table is not None else QUEUE_SPEC_SETTINGS:
        if setting.name == name:
            return setting
    raise KeyError(name)
