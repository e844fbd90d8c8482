"""Retry policy: after a failed attempt, retry later (on which retry topic, due when) or give up.

Two shapes:

* an explicit delay sequence, e.g. ``5m, 5m, 30m, 30m, 30m, 1h``: six retries, one retry topic
  per distinct delay;
* exponential backoff: ``initial * multiplier**n`` capped at ``max_delay``, with jitter, up to
  ``max_attempts`` attempts in all.

A retry topic is chosen by the *nominal* delay (without jitter), so the number of retry topics
stays small; the message's due time carries the jitter. Nothing is ever due before
``failed_at + nominal delay * (1 - jitter)``; the retry consumer never processes a message early.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from kmq_dagster.core.durations import MAX_DURATION_MS, format_duration_ms, parse_duration_ms
from kmq_dagster.core.queue_settings import RETRY_SETTINGS, check_settings
from kmq_dagster.errors import ConfigError

#: Attempts in all (the first delivery included) of a backoff policy unless told otherwise.
DEFAULT_BACKOFF_ATTEMPTS = 5
#: The error ``message.decoded()`` raises for a value not in its declared format (see
#: :mod:`kmq_dagster.schemas.wire`); its dead letters' reason says so, with the why.
UNDECODABLE_VALUE = "UndecodableValue"
#: How an ``UndecodableValue`` message starts when it was the key that could not be decoded.
UNDECODABLE_KEY_MARK = "the key: "
#: Error types that never go to a retry topic: retrying cannot fix what cannot be decoded, nor
#: a handler that returns a generator instead of doing its work (``HandlerResultError``).
#: (``RegistryUnavailable``, a schema registry that did not answer, is retried.)
ALWAYS_FATAL: frozenset[str] = frozenset(
    {
        "UnicodeDecodeError",
        "JSONDecodeError",
        "DeserializationError",
        "HandlerResultError",
        UNDECODABLE_VALUE,
    }
)
#: Longest error text a dead letter's reason quotes (characters).
MAX_REASON_DETAIL = 300


@dataclass(frozen=True)
class Retry:
    """Try again: send the message to the retry topic of ``topic_delay_ms``, due at ``due_ms``."""

    attempt: int
    topic_delay_ms: int
    due_ms: int


@dataclass(frozen=True)
class DeadLetter:
    """Give up: send the message to the dead-letter topic with ``reason``."""

    attempt: int
    reason: str


@dataclass(frozen=True)
class RetryPolicy:
    """When and how often a failed message is retried.

    Args:
        delays_ms: explicit delays, one per retry; when set, ``max_attempts`` is
            ``len(delays_ms) + 1`` and the backoff fields are ignored.
        initial_delay_ms: exponential backoff: the first delay.
        multiplier: exponential backoff: each delay is the previous one times this.
        max_delay_ms: exponential backoff: no delay is longer.
        jitter: fraction in [0, 1); a due time is spread by up to this share of its delay.
        max_attempts: attempts in all, the first delivery included (backoff only).
        non_retryable: exception type names that go straight to the DLQ.
    """

    delays_ms: tuple[int, ...] = ()
    initial_delay_ms: int = 1_000
    multiplier: float = 2.0
    max_delay_ms: int = 600_000
    jitter: float = 0.0
    max_attempts: int = 4
    non_retryable: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        """Refuse policies that make no sense.

        Raises:
            ConfigError: a delay is not positive or longer than ``MAX_DURATION_MS``, the initial
                delay exceeds the maximum, the multiplier is below 1, NaN or infinite, jitter is
                outside [0, 1), or there are no attempts.
        """
        for delay_ms in (*self.delays_ms, self.initial_delay_ms, self.max_delay_ms):
            if not 0 < delay_ms <= MAX_DURATION_MS:
                raise ConfigError(
                    f"retry delays must be more than 0 and at most {MAX_DURATION_MS} ms, "
                    f"got {delay_ms}"
                )
        if self.max_delay_ms < self.initial_delay_ms:
            raise ConfigError(
                f"the initial retry delay ({self.initial_delay_ms} ms) must not exceed the "
                f"maximum delay ({self.max_delay_ms} ms)"
            )
        if not 1 <= self.multiplier < math.inf:  # also refuses NaN
            raise ConfigError(
                f"the backoff multiplier must be a finite number >= 1, got {self.multiplier}"
            )
        check_settings(self, RETRY_SETTINGS)  # jitter and max_attempts, as every front end

    @classmethod
    def fixed(cls, delays_ms: Iterable[int], non_retryable: Iterable[str] = ()) -> RetryPolicy:
        """A policy with one retry per given delay."""
        return cls(delays_ms=tuple(delays_ms), non_retryable=frozenset(non_retryable))

    @classmethod
    def exponential(
        cls,
        spec: str,
        *,
        max_attempts: int,
        jitter: float = 0.0,
        non_retryable: Iterable[str] = (),
    ) -> RetryPolicy:
        """A backoff policy from ``"INITIAL,MULTIPLIER,MAX"``, e.g. ``"1s,2,10m"``.

        Raises:
            ConfigError: the spec or a value is malformed.
        """
        parts = [part.strip() for part in spec.split(",")]
        try:
            if len(parts) != 3:
                raise ConfigError("three values needed")
            try:
                multiplier = float(parts[1])
            except ValueError:
                raise ConfigError(f"not a number: {parts[1]!r}") from None
            return cls(
                initial_delay_ms=parse_duration_ms(parts[0]),
                multiplier=multiplier,
                max_delay_ms=parse_duration_ms(parts[2]),
                jitter=jitter,
                max_attempts=max_attempts,
                non_retryable=frozenset(non_retryable),
            )
        except ConfigError as exc:
            raise ConfigError(
                f"a backoff takes INITIAL,MULTIPLIER,MAX, e.g. 1s,2,10m; got {spec!r} ({exc})",
                setting="retry_backoff",
            ) from None

    @classmethod
    def from_options(
        cls,
        *,
        delays: str | None = None,
        backoff: str | None = None,
        max_attempts: int | None = None,
        jitter: float | None = None,
        default_delays_ms: Iterable[int],
    ) -> RetryPolicy:
        """The policy that textual options describe (the CLI's, a config file's).

        Args:
            delays: ``"10s,1m,10m"``: one retry per delay.
            backoff: ``"INITIAL,MULTIPLIER,MAX"`` instead of ``delays``.
            max_attempts: attempts in all with ``backoff`` (default
                :data:`DEFAULT_BACKOFF_ATTEMPTS`); with ``delays`` every delay is one retry.
            jitter: spread of each due time, a share of its delay in [0, 1).
            default_delays_ms: the delays when neither ``delays`` nor ``backoff`` is given.

        Raises:
            ConfigError: contradictory or malformed options.
        """
        if backoff is not None:
            if delays is not None:
                raise ConfigError(
                    "give retry delays or a retry backoff, not both", setting="retry_backoff"
                )
            return cls.exponential(
                backoff, max_attempts=max_attempts or DEFAULT_BACKOFF_ATTEMPTS, jitter=jitter or 0.0
            )
        if max_attempts is not None:
            raise ConfigError(
                "max attempts go with a retry backoff; with retry delays every delay is one retry",
                setting="max_attempts",
            )
        delays_ms = tuple(default_delays_ms) if delays is None else parse_delay_list(delays)
        return cls(delays_ms=delays_ms, jitter=jitter or 0.0)

    def with_non_retryable(self, names: Iterable[str]) -> RetryPolicy:
        """A copy whose ``non_retryable`` also holds ``names`` (exception type names)."""
        extra = frozenset(name.strip() for name in names if name.strip())
        return dataclasses.replace(self, non_retryable=self.non_retryable | extra)

    def describe(self) -> str:
        """The policy in a few words, e.g. ``retry delays 10s,1m,10m`` (no error types)."""
        if self.delays_ms:
            text = "retry delays " + ",".join(format_duration_ms(d) for d in self.delays_ms)
        else:
            text = (
                f"backoff {format_duration_ms(self.initial_delay_ms)} x{self.multiplier:g} up to "
                f"{format_duration_ms(self.max_delay_ms)}, {self.max_attempts} attempts"
            )
        return text + (f", jitter {self.jitter:g}" if self.jitter else "")

    @property
    def attempts(self) -> int:
        """Attempts in all, the first delivery included."""
        return len(self.delays_ms) + 1 if self.delays_ms else self.max_attempts

    def nominal_delay_ms(self, retry_number: int) -> int:
        """Delay before retry ``retry_number`` (1-based), before jitter."""
        if self.delays_ms:
            return self.delays_ms[retry_number - 1]
        try:
            delay = self.initial_delay_ms * self.multiplier ** (retry_number - 1)
        except OverflowError:  # the power left the float range: far beyond any cap
            return self.max_delay_ms
        return int(min(delay, self.max_delay_ms))

    def topic_delays_ms(self) -> list[int]:
        """Every distinct nominal delay, ascending: one retry topic each."""
        return sorted({self.nominal_delay_ms(n) for n in range(1, self.attempts)})

    def is_retryable(self, error: BaseException | str) -> bool:
        """Whether a failure of this type (an exception or its type name) is worth retrying."""
        name = error if isinstance(error, str) else type(error).__name__
        return name not in self.non_retryable and name not in ALWAYS_FATAL

    def after_failure(
        self,
        attempt: int,
        error_type: str,
        failed_at_ms: int,
        rng: random.Random,
        error_message: str = "",
    ) -> Retry | DeadLetter:
        """Decide what follows failed attempt number ``attempt`` (1 = the first delivery).

        An undecodable value is dead-lettered at once with the reason
        ``undecodable value: <why>`` (``why`` from ``error_message``), an undecodable key with
        ``undecodable key: <why>``.
        """
        if error_type == UNDECODABLE_VALUE:
            field = "value"
            if error_message.startswith(UNDECODABLE_KEY_MARK):
                field, error_message = "key", error_message[len(UNDECODABLE_KEY_MARK) :]
            detail = error_message[:MAX_REASON_DETAIL] or "not in the queue's declared format"
            return DeadLetter(attempt, f"undecodable {field}: {detail}")
        if not self.is_retryable(error_type):
            return DeadLetter(attempt, f"non-retryable error {error_type}")
        if attempt >= self.attempts:
            return DeadLetter(attempt, f"failed {attempt} attempts, the last with {error_type}")
        delay_ms = self.nominal_delay_ms(attempt)
        spread_ms = int(delay_ms * self.jitter * (2 * rng.random() - 1))
        return Retry(attempt + 1, delay_ms, failed_at_ms + delay_ms + spread_ms)


def parse_delay_list(text: str) -> tuple[int, ...]:
    """Parse ``"10s,1m,10m"`` into milliseconds.

    Raises:
        ConfigError: empty, an empty entry (``1s,,2s``: a typo, not a list of two), or an
            entry that is not a positive duration.
    """
    parts = text.split(",")
    try:
        delays_ms = tuple(parse_duration_ms(part) for part in parts if part.strip())
    except ConfigError:
        delays_ms = ()
    if len(delays_ms) != len(parts) or any(delay_ms <= 0 for delay_ms in delays_ms):
        raise ConfigError(
            "retry delays are a comma-separated list of positive durations, e.g. 10s,1m,10m; "
            f"got {text!r}",
            setting="retry_delays",
        )
    return delays_ms
