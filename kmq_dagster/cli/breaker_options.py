"""The circuit breaker's options of ``kmq worker``: parsed once, built into a shared breaker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from kmq_dagster.cli.options import gathered_options
from kmq_dagster.cli.value_types import Number, duration_option
from kmq_dagster.core.queue import Queue


@dataclass(frozen=True)
class BreakerOptions:
    enabled: bool
    window_ms: int
    error_rate: float
    min_calls: int
    cooldown_ms: int
    probes: int

    def build(self, queue: Queue, audit_url: str | None) -> Any:
        """The group's shared breaker, or ``None`` without ``--breaker``."""
        if not self.enabled:
            return None
        from kmq_dagster.audit.shared_breaker import SharedBreaker, breaker_config
        from kmq_dagster.audit.store import AuditStore

        config = breaker_config(
            window_ms=self.window_ms,
            error_rate=self.error_rate,
            min_calls=self.min_calls,
            cooldown_ms=self.cooldown_ms,
            probes=self.probes,
        )
        return SharedBreaker.for_queue(queue, AuditStore(audit_url), config)


def breaker_options(command: Any) -> Any:
    """The circuit breaker's options; the command receives ``breaker: BreakerOptions``."""
    names = ("breaker", "breaker_window", "breaker_error_rate", "breaker_min_calls",
             "breaker_cooldown", "breaker_probes")  # fmt: skip
    return gathered_options(
        "breaker",
        BreakerOptions,
        names,
        [
            click.option(
                "--breaker",
                is_flag=True,
                help="Circuit breaker: stop fetching while the handler fails en masse; its "
                "state is shared by the group's workers through the audit store.",
            ),
            duration_option(
                "--breaker-window", "30s", "Sliding window the error rate is measured over."
            ),
            click.option(
                "--breaker-error-rate",
                type=Number(0, 1, low_open=True),
                default=0.5,
                show_default=True,
                help="Failed share of calls in the window that opens it.",
            ),
            click.option(
                "--breaker-min-calls",
                type=click.IntRange(1, 1_000_000),
                default=20,
                show_default=True,
                help="Calls in the window before the rate counts.",
            ),
            duration_option(
                "--breaker-cooldown",
                "10s",
                "How long it stays open at first (doubles per failed probe, up to 5m).",
            ),
            click.option(
                "--breaker-probes",
                type=click.IntRange(1, 1000),
                default=3,
                show_default=True,
                help="Messages let through to test recovery.",
            ),
        ],
    )(command)
