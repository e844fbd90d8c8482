"""The circuit breaker's options of ``kmq worker``: parsed once, built into a shared breaker.

Each option is the breaker setting of the same name (``core/queue_settings.py``); one left out
keeps :class:`~kmq_dagster.BreakerConfig`'s default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from kmq_dagster.cli.options import gathered_options
from kmq_dagster.cli.setting_options import setting_option, shown_default
from kmq_dagster.core.breaker_config import BreakerConfig
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.queue_settings import BREAKER_SETTINGS

#: The breaker settings the command line takes, in the order of their options.
FLAGGED = tuple(setting for setting in BREAKER_SETTINGS if setting.flag)


@dataclass(frozen=True)
class BreakerOptions:
    enabled: bool
    #: The settings given, by name (``window_ms``); the others keep their defaults.
    given: dict[str, Any]

    def build(self, queue: Queue, audit_url: str | None) -> Any:
        """The group's shared breaker, or ``None`` without ``--breaker``."""
        if not self.enabled:
            return None
        from kmq_dagster.audit.shared_breaker import SharedBreaker, breaker_config
        from kmq_dagster.audit.store import AuditStore

        config = breaker_config(**{**self.defaults(), **self.given})
        return SharedBreaker.for_queue(queue, AuditStore(audit_url), config)

    @staticmethod
    def defaults() -> dict[str, Any]:
        config = BreakerConfig()
        return {setting.name: getattr(config, setting.name) for setting in FLAGGED}


def _gather(enabled: bool, *values: Any) -> BreakerOptions:
    given = {s.name: v for s, v in zip(FLAGGED, values, strict=True) if v is not None}
    return BreakerOptions(enabled, given)


def breaker_options(command: Any) -> Any:
    """The circuit breaker's options; the command receives ``breaker: BreakerOptions``."""
    names = ("breaker", *(s.flag.removeprefix("--").replace("-", "_") for s in FLAGGED if s.flag))
    return gathered_options(
        "breaker",
        _gather,
        names,
        [
            click.option(
                "--breaker",
                is_flag=True,
                help="Circuit breaker: stop fetching while the handler fails en masse; its "
                "state is shared by the group's workers through the audit store.",
            ),
            *(
                setting_option(setting, note=f"[default: {shown_default(BreakerConfig, setting)}]")
                for setting in FLAGGED
            ),
        ],
    )(command)
