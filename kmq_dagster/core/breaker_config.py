"""The circuit breaker's states and settings (:mod:`kmq_dagster.core.breaker` is its state
machine): when it opens, how long it stays open, how it probes."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kmq_dagster.core.queue_settings import BREAKER_SETTINGS, check_settings
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
        check_settings(self, BREAKER_SETTINGS)  # the bounds, as every front end checks them
        if self.max_cooldown_ms < self.cooldown_ms:
            raise ConfigError(
                f"breaker max_cooldown_ms ({self.max_cooldown_ms}) must not be below "
                f"cooldown_ms ({self.cooldown_ms})"
            )
