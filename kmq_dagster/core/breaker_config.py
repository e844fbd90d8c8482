"""The circuit breaker's states and settings (:mod:`kmq_dagster.core.breaker` is its state
machine): when it opens, how long it stays open, how it probes."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from kmq_dagster.core.durations import MAX_DURATION_MS
from kmq_dagster.errors import ConfigError


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    """When the breaker opens, how long it stays open, how it probes."""

    window_ms: int = 30_000
    min_calls: int = 20
    error_rate: float = 0.5
    consecutive_failures: int = 10
    cooldown_ms: int = 10_000
    cooldown_multiplier: float = 2.0
    max_cooldown_ms: int = 300_000
    probes: int = 3

    def __post_init__(self) -> None:
        """Refuse settings under which the breaker could not work as documented.

        Raises:
            ConfigError: a setting is out of range, NaN or infinite.
        """
        for name in ("window_ms", "cooldown_ms", "max_cooldown_ms"):
            if not 0 < getattr(self, name) <= MAX_DURATION_MS:
                raise ConfigError(
                    f"breaker {name} must be more than 0 and at most {MAX_DURATION_MS} ms, "
                    f"got {getattr(self, name)}"
                )
        if not 0 < self.error_rate <= 1:  # also refuses NaN: every comparison with it is false
            raise ConfigError(f"breaker error_rate must be in (0, 1], got {self.error_rate}")
        for name in ("min_calls", "consecutive_failures", "probes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"breaker {name} must be at least 1, got {getattr(self, name)}")
        if not 1 <= self.cooldown_multiplier < math.inf:
            raise ConfigError(
                f"breaker cooldown_multiplier must be a finite number >= 1, "
                f"got {self.cooldown_multiplier}"
            )
        if self.max_cooldown_ms < self.cooldown_ms:
            raise ConfigError(
                f"breaker max_cooldown_ms ({self.max_cooldown_ms}) must not be below "
                f"cooldown_ms ({self.cooldown_ms})"
            )
