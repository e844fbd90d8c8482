"""Options several commands share, and small helpers their command functions share while
they run (signals, progress lines, a stats log, the metrics server).

The click value types these options use are in ``kmq_dagster.cli.value_types``; the
queue-definition options of ``kmq provision`` alone are in
``kmq_dagster.cli.queue_definition_options``.
"""

from __future__ import annotations

import faulthandler
import functools
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kmq_dagster.cli import signal_safe
from kmq_dagster.cli.setting_options import setting_option
from kmq_dagster.cli.value_types import Moment
from kmq_dagster.core.dead_letter_formats import FORMATS
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.core.queue_settings import CONCURRENCY, NON_RETRYABLE, ORDERING
from kmq_dagster.core.replay import ReplaySelection, TimeBound, parse_offsets

if TYPE_CHECKING:
    from kmq_dagster.kafka.opened_queue import OpenedQueue
    from kmq_dagster.settings import KmqSettings

F = TypeVar("F", bound=Callable[..., Any])


def add_options(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    """One decorator for a list of click options, in the order given."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def gathered_options(
    into: str,
    build: Callable[..., Any],
    names: tuple[str, ...],
    options: list[Callable[[F], F]],
) -> Callable[[F], F]:
    """Click ``options`` whose values the command receives as one object: keyword ``into`` is
    ``build(*values)``, the values of the parameters ``names`` in that order."""

    def decorate(command: F) -> F:
        def with_gathered(*args: Any, **kwargs: Any) -> Any:
            values = [kwargs.pop(name) for name in names]
            return command(*args, **{into: build(*values)}, **kwargs)

        functools.update_wrapper(with_gathered, command)  # keeps options added below it
        return add_options(options)(with_gathered)  # type: ignore[arg-type]

    return decorate


topic_option = click.option("--topic", "-t", required=True, help="The queue topic.")
group_option = click.option("--group", "-g", required=True, help="Consumer group.")
queue_options = add_options([topic_option, group_option])


@dataclass(frozen=True)
class DeadLetterSource:
    """Where a command reads dead letters: a queue's DLQ (``topic`` and ``group``) or a
    dead-letter topic of its own (``dlq_topic``, in ``dead_letter_format``)."""

    topic: str | None
    group: str | None
    dlq_topic: str | None
    dead_letter_format: str

    def open(self, settings: KmqSettings) -> OpenedQueue:
        """The dead letters opened (see ``open_dead_letters`` for the errors)."""
        from kmq_dagster.kafka.foreign_dlq import open_dead_letters

        return open_dead_letters(
            settings, topic=self.topic, group=self.group, dlq_topic=self.dlq_topic,
            dead_letter_format=self.dead_letter_format,
        )  # fmt: skip


#: ``--topic``/``--group`` or ``--dlq-topic``/``--format``: the command receives them as one
#: ``source: DeadLetterSource``.
dead_letter_source_options = gathered_options(
    "source",
    DeadLetterSource,
    ("topic", "group", "dlq_topic", "dead_letter_format"),
    [
        click.option("--topic", "-t", help="The queue topic (with --group)."),
        click.option("--group", "-g", help="Consumer group (with --topic)."),
        click.option(
            "--dlq-topic",
            metavar="TOPIC",
            help="A dead-letter topic another framework writes, instead of a queue's DLQ.",
        ),
        click.option(
            "--format",
            "dead_letter_format",
            type=click.Choice(FORMATS),
            default="kmq",
            show_default=True,
            help="How --dlq-topic's headers name the original and the error: kmq (ours) or "
            "spring (Spring Kafka's kafka_dlt-* headers).",
        ),
    ],
)


def port_option(flag: str, default: int, help: str) -> Callable[[F], F]:
    """A TCP port to listen on (0: a free one, which the command reports)."""
    return click.option(
        flag, type=click.IntRange(0, 65535), default=default, show_default=True, help=help
    )


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
                offsets={} if offsets is None else parse_offsets(offsets),
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


#: Exit code of a command Ctrl-C stopped, however cleanly: the shell's 128 + SIGINT.
EXIT_INTERRUPTED = 130

#: The signals that asked this process to stop, first first (see :func:`stop_exit_code`).
_stop_signals: list[int] = []


#: Sent to a running long-lived command (``kill -USR1 PID``), it writes every thread's stack
#: to stderr and goes on: what an operator looks at when a worker seems stuck.
DUMP_STACKS_SIGNAL = signal.SIGUSR1


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or Ctrl-C, so loops finish their step and clean up; which
    signal came first decides the exit code (:func:`stop_exit_code`). From here on,
    :data:`DUMP_STACKS_SIGNAL` writes every thread's stack to stderr.

    The event is set a moment after the signal, on a thread of its own
    (:mod:`kmq_dagster.cli.signal_safe`): a handler setting it itself hung the process when
    a second Ctrl-C came during the first one's ``set``."""
    faulthandler.register(DUMP_STACKS_SIGNAL, all_threads=True)
    stop_requested = threading.Event()
    _stop_signals.clear()
    signal_safe.prepare()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        _stop_signals.append(signum)
        signal_safe.set_soon(stop_requested)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop_requested


def first_stop_signal() -> int | None:
    """The signal that first asked this process to stop (SIGINT, SIGTERM), if one did."""
    return _stop_signals[0] if _stop_signals else None


def stop_exit_code() -> int:
    """The exit code of a command that stopped cleanly: :data:`EXIT_INTERRUPTED` if Ctrl-C
    (SIGINT) asked it to, as a shell reports a command Ctrl-C killed, so scripts see the
    interruption; 0 for SIGTERM, a service manager's ordinary stop (systemd and Kubernetes
    take 0 as a clean stop), or no signal."""
    return EXIT_INTERRUPTED if _stop_signals[:1] == [signal.SIGINT] else 0


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


#: ``--non-retryable NAMES`` of ``kmq worker`` and ``kmq spark`` (the stored definition leaves
#: it out: which errors are fatal is the handler's business).
non_retryable_option = setting_option(NON_RETRYABLE, default="", metavar="NAMES")


def concurrency_options(concurrency_help: str, ordering_help: str) -> Callable[[F], F]:
    """``--concurrency`` (calls at once, 1 by default) and ``--ordering`` (partition by
    default), the settings of the same names (``core/queue_settings.py``), as ``kmq worker``
    and ``kmq spark`` take them; each command says what they mean for it."""
    return add_options(
        [
            setting_option(CONCURRENCY, help=concurrency_help, default=1, show_default=True),
            setting_option(
                ORDERING,
                help=ordering_help,
                default=Ordering.PARTITION.value,
                show_default=True,
                metavar=None,
            ),
        ]
    )
