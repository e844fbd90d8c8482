"""Options several commands share, and the value types that check them as they are parsed."""

from __future__ import annotations

import functools
import math
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import click

from kmq_dagster.core.durations import format_duration_ms, parse_duration_ms
from kmq_dagster.core.queue import (
    DEFAULT_MAX_REDELIVERIES,
    DEFAULT_RETRY_DELAYS_MS,
    DEFAULT_VISIBILITY_TIMEOUT_MS,
    MAX_VISIBILITY_TIMEOUT_MS,
    Queue,
)
from kmq_dagster.core.replay import ReplaySelection, TimeBound, parse_offsets, parse_time
from kmq_dagster.core.retry import DEFAULT_BACKOFF_ATTEMPTS, RetryPolicy
from kmq_dagster.errors import ConfigError
from kmq_dagster.settings import KmqSettings

F = TypeVar("F", bound=Callable[..., Any])


class Duration(click.ParamType[int, Any]):
    """A duration such as ``90s`` or ``1h30m``, as milliseconds within a range."""

    name = "duration"

    def __init__(self, *, min_ms: int = 1, max_ms: int = MAX_VISIBILITY_TIMEOUT_MS) -> None:
        self.min_ms = min_ms
        self.max_ms = max_ms

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            duration_ms = parse_duration_ms(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
        if not self.min_ms <= duration_ms <= self.max_ms:
            self.fail(f"{value!r} is outside {_ms(self.min_ms)} to {_ms(self.max_ms)}", param, ctx)
        return duration_ms


class Number(click.ParamType[float, Any]):
    """A finite number within ``[low, high]`` (``high`` excluded when ``high_open``)."""

    name = "number"

    def __init__(
        self, low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False
    ) -> None:
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        low_ok = number > self.low if self.low_open else number >= self.low
        high_ok = number < self.high if self.high_open else number <= self.high
        if not math.isfinite(number) or not (low_ok and high_ok):
            low = "(" if self.low_open else "["
            high = ")" if self.high_open else "]"
            self.fail(f"{value!r} is not in {low}{self.low:g}, {self.high:g}{high}", param, ctx)
        return number


class Moment(click.ParamType[TimeBound, Any]):
    """A point in time: ISO 8601 or a duration ago (``2h``, ``2h ago``)."""

    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> TimeBound:
        try:
            return parse_time(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


def _ms(duration_ms: int) -> str:
    return format_duration_ms(duration_ms)


def add_options(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    """One decorator for a list of click options, in the order given."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


topic_option = click.option("--topic", "-t", required=True, help="The queue topic.")
group_option = click.option("--group", "-g", required=True, help="Consumer group.")
queue_options = add_options([topic_option, group_option])
audit_url_option = click.option(
    "--audit-url",
    metavar="URL",
    help="SQLAlchemy URL of the audit store [env KMQ_AUDIT_URL; default sqlite:///~/.kmq/audit.db].",
)
metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve Prometheus metrics on this port (all interfaces), at /metrics.",
)
actor_option = click.option(
    "--actor", default=None, help="Who runs it, for the audit log [default: user@host]."
)


def dead_letter_selection_options(*, offsets: bool) -> Callable[[F], F]:
    """``--key``, ``--error-type``, ``--since``, ``--until`` (and ``--offsets``): the command
    receives them as one ``selection: ReplaySelection``."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_selection(
            *args: Any,
            key: str | None,
            error_type: str | None,
            since: TimeBound | None,
            until: TimeBound | None,
            offsets: str | None = None,
            **kwargs: Any,
        ) -> Any:
            selection = ReplaySelection(
                offsets=parse_offsets(offsets) if offsets else {},
                key=None if key is None else key.encode(),
                error_type=error_type,
                since=since,
                until=until,
            )
            return command(*args, selection=selection, **kwargs)

        options = [
            click.option("--key", "-k", help="Only dead letters with this key."),
            click.option(
                "--error-type", metavar="NAME", help="Only this exception type, e.g. TimeoutError."
            ),
            click.option(
                "--since",
                type=Moment(),
                metavar="TIME",
                help="Dead-lettered at or after: ISO time (UTC unless an offset is given) "
                "or a duration ago, e.g. 2h or '2h ago'.",
            ),
            click.option(
                "--until",
                type=Moment(),
                metavar="TIME",
                help="Dead-lettered before: ISO time or a duration ago.",
            ),
        ]
        if offsets:
            options.append(
                click.option(
                    "--offsets",
                    metavar="P:FIRST-LAST,...",
                    help="DLQ offsets, e.g. 0:10-20,1:5,1:40-.",
                )
            )
        return add_options(options)(with_selection)  # type: ignore[return-value]

    return decorate


#: The options of a queue's definition: ``kmq provision`` stores it, every other command reads
#: the stored one and refuses these (see ``QUEUE_DEFINITION_HINT``).
QUEUE_DEFINITION_OPTIONS = (
    "--retry-delays",
    "--retry-backoff",
    "--max-attempts",
    "--retry-jitter",
    "--visibility-timeout",
    "--max-redeliveries",
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
        return settings.define_queue(
            topic,
            group,
            partitions=partitions,
            retry_policy=self.retry_policy(settings),
            visibility_timeout_ms=self.visibility_timeout_ms,
            max_redeliveries=self.max_redeliveries,
        )


def definition_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the queue-definition options (``kmq provision``'s alone); the command receives
    ``definition``."""

    def with_definition(
        *args: Any,
        retry_delays: str | None,
        retry_backoff: str | None,
        max_attempts: int | None,
        retry_jitter: float | None,
        visibility_timeout: int | None,
        max_redeliveries: int | None,
        **kwargs: Any,
    ) -> Any:
        definition = DefinitionOptions(
            retry_delays,
            retry_backoff,
            max_attempts,
            retry_jitter,
            visibility_timeout,
            max_redeliveries,
        )
        return command(*args, definition=definition, **kwargs)

    functools.update_wrapper(with_definition, command)  # keeps options added below it
    return add_options(
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
                f"[env KMQ_VISIBILITY_TIMEOUT; default {_ms(DEFAULT_VISIBILITY_TIMEOUT_MS)}].",
            ),
            click.option(
                "--max-redeliveries",
                type=click.IntRange(0, 1000),
                help="Redeliveries before the DLQ [env KMQ_MAX_REDELIVERIES; default "
                f"{DEFAULT_MAX_REDELIVERIES}].",
            ),
        ]
    )(with_definition)


def _delays(delays_ms: tuple[int, ...]) -> str:
    return ",".join(_ms(delay_ms) for delay_ms in delays_ms)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or Ctrl-C, so loops finish their step and clean up."""
    stop_requested = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop_requested


def default_actor() -> str:
    """``user@host`` of whoever runs the command."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def report(line: str) -> None:
    """A progress line: on stderr, so stdout's last line stays the command's result."""
    click.echo(line, err=True)


def log_every(stop: threading.Event, seconds: float, line: Callable[[], str], name: str) -> None:
    """Log ``line()`` every ``seconds`` on logger ``name`` until ``stop`` is set (a thread)."""
    import logging

    log = logging.getLogger(name)

    def loop() -> None:
        while not stop.wait(seconds):
            log.info("%s", line())

    threading.Thread(target=loop, name=f"{name}-stats", daemon=True).start()


def serve_metrics_of(
    port: int | None, service: str, topic: str, group: str, read: Callable[[], Any]
) -> Any:
    """Start the metrics server of ``--metrics-port`` (``None``: no server, returns ``None``).

    Raises:
        ConfigError: the port cannot be bound.
    """
    if port is None:
        return None
    from kmq_dagster.metrics import ServiceMetrics, serve_metrics

    return serve_metrics(port, ServiceMetrics(service, topic, group, read))
