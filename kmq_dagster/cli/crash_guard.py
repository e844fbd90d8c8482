"""The command line's side of ``kmq_dagster.crash_guard``: ``kmq tracker`` and ``kmq worker``
run supervised, and the line that explains a crash of their Kafka client.

A command decorated with :func:`crash_guarded` replaces its process with the supervisor when
run as the real ``kmq`` (not from Python, not already supervised), once its settings are
checked. The supervisor runs it again in a child; if that child crashes, the command runs a
third time in explain mode and prints what the cluster's state says went wrong: the known
cause is a topic of the queue deleted under it, an error like any other (exit code 1).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kmq_dagster.cli.app import EXIT_ERROR, settings_of
from kmq_dagster.core.durations import seconds_from_env
from kmq_dagster.crash_guard import EXPLAIN_ENV, STOP_DEADLINE_ENV, STOP_GRACE_S
from kmq_dagster.secrets import mask_text
from kmq_dagster.settings import KmqSettings

F = TypeVar("F", bound=Callable[..., Any])
#: Overrides :data:`~kmq_dagster.crash_guard.STOP_GRACE_S` (seconds; tests use a short one).
STOP_GRACE_ENV = "KMQ_CRASH_GUARD_STOP_GRACE_S"


def crash_guarded(command: F) -> F:
    """Run ``command`` (one taking ``ctx``, ``topic`` and ``group``) supervised; see the
    module docstring."""

    @functools.wraps(command)
    def guarded(ctx: click.Context, *args: Any, **kwargs: Any) -> Any:
        given = ctx.find_root().ensure_object(dict)
        crashed = os.environ.get(EXPLAIN_ENV)
        if crashed:
            line, code = explain_crash(
                settings_of(ctx),
                str(ctx.command.name),
                kwargs["topic"],
                kwargs["group"],
                signal.Signals(int(crashed)),
            )
            click.echo(f"kmq: error: {mask_text(line)}", err=True)
            return code
        if given.get("crash_guard"):
            settings_of(ctx)  # a bad -b or -X is one error line here, before anything starts
            sys.stdout.flush()
            sys.stderr.flush()
            supervisor = [sys.executable, "-m", "kmq_dagster.crash_guard", *given["argv"]]
            os.execve(sys.executable, supervisor, {**os.environ, **stop_deadline_env(kwargs)})
        return command(ctx, *args, **kwargs)

    return guarded  # type: ignore[return-value]


def stop_deadline_env(options: dict[str, Any]) -> dict[str, str]:
    """The supervisor's stop deadline for a command run with ``options``: its own deadline
    (``kmq worker``'s ``drain_timeout``) plus the grace to write acks and leave its group."""
    grace_s = seconds_from_env(os.environ, STOP_GRACE_ENV, STOP_GRACE_S, zero_allowed=True)
    return {STOP_DEADLINE_ENV: f"{(options.get('drain_timeout') or 0.0) + grace_s:g}"}


def explain_crash(
    settings: KmqSettings, command: str, topic: str, group: str, crash: signal.Signals
) -> tuple[str, int]:
    """The error line and exit code of a command whose Kafka client crashed: a missing topic
    of the queue (the known cause) is an error like any other (exit 1)."""
    from kmq_dagster.errors import KmqError
    from kmq_dagster.kafka.queues import open_queue

    try:
        open_queue(settings, topic, group)
    except KmqError as exc:
        return f"{command} stopped: its Kafka client crashed ({crash.name}): {exc}", EXIT_ERROR
    return (
        f"{command} stopped: its Kafka client crashed ({crash.name}); the queue's topics are "
        "all there, so start it again",
        128 + crash,
    )
