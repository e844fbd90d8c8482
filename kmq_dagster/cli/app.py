"""The root of the ``kmq`` command: connection options, logging, and one-line errors."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from kmq_dagster.cli.argv_checks import first_undecodable_argument, register_argv_secrets
from kmq_dagster.cli.options import EXIT_INTERRUPTED, stop_exit_code
from kmq_dagster.cli.queue_definition_options import (
    QUEUE_DEFINITION_HINT,
    QUEUE_DEFINITION_OPTIONS,
)
from kmq_dagster.core.queue_settings import all_settings
from kmq_dagster.crash_guard import CHILD_ENV
from kmq_dagster.errors import ConfigError, KmqError
from kmq_dagster.home import private_folder
from kmq_dagster.secrets import mask_text
from kmq_dagster.settings import KmqSettings, parse_client_options

F = TypeVar("F", bound=Callable[..., Any])

#: Exit code of an error (a bad value, an unreachable broker, missing topics, ...).
EXIT_ERROR = 1
#: Exit code of a malformed command line (an unknown option, a missing required one); click's
#: and argparse's convention.
EXIT_USAGE = 2

#: Library setting -> the option that sets it, so errors name what the user typed.
OPTION_FOR_SETTING = {
    # a queue's bounded settings: their flags (core/queue_settings.py)
    **{
        setting.name: setting.flag for setting in all_settings() if setting.flag and setting.bounded
    },
    "group": "--group",
    "bootstrap_servers": "--bootstrap-servers",
    "client_config": "-X",
    "-X": "-X",
    "retry_delays": "--retry-delays",
    "retry_delays_ms": "--retry-delays",
    "retry_backoff": "--retry-backoff",
    "delay_levels": "--delay-levels",
    "batch_size": "--batch-size",
    "handler": "--handler",
    "time": "--since/--until",
    "since": "--since/--until",
    "offsets": "--offsets",
    "rate_per_s": "--rate",
    "max_replays": "--max-replays",
    "replay_id": "--replay-id",
    "redefine": "--redefine",
    "metrics_port": "--metrics-port",
}

#: Why an option's range is what it is, added to the error for a value outside it.
BAD_VALUE_HINT = {
    "--partitions": " (the queue and markers topics get this many partitions and the others "
    "half: 1,000 is already 4,500 in all with 3 retry delays, 13,500 with the delay queue; "
    "create larger topics with Kafka's tools, kmq adopts their count)",
}


def connection_options(command: F) -> F:
    """``-b``, ``-X`` and ``-v`` on ``command`` (and on the root): where Kafka is, client
    settings, and verbose logs. The command then takes ``settings`` from :func:`settings_of`."""

    def remember(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        store = ctx.find_root().ensure_object(dict)
        if param.name == "client_options":
            store.setdefault("client_options", []).extend(value)
        elif value or value == "":  # an empty -b is an error to report, not "not given"
            store[param.name] = value
        if param.name in ("verbose", "log_json") and value:
            configure_logging(
                verbose=bool(store.get("verbose")), as_json=bool(store.get("log_json"))
            )

    options = [
        click.option(
            "--bootstrap-servers",
            "-b",
            metavar="HOST:PORT",
            expose_value=False,
            callback=remember,
            help="Kafka to use [env KMQ_BOOTSTRAP_SERVERS; default: the embedded broker, "
            "127.0.0.1:9092].",
        ),
        click.option(
            "-X",
            "client_options",
            multiple=True,
            metavar="KEY=VALUE",
            expose_value=False,
            callback=remember,
            help="confluent-kafka setting, e.g. -X security.protocol=SASL_SSL [env KMQ_KAFKA_*].",
        ),
        click.option(
            "--verbose",
            "-v",
            is_flag=True,
            expose_value=False,
            callback=remember,
            help="Show debug logs, the Kafka client's and Spark's.",
        ),
        click.option(
            "--log-json",
            is_flag=True,
            expose_value=False,
            callback=remember,
            help="Logs as one JSON object per line (time, level, logger, message).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kmq-dagster", prog_name="kmq")
@connection_options
@click.pass_context
def cli(ctx: click.Context) -> None:
    """A reliable work queue on Kafka: per-message ack, redelivery, retries, DLQ.

    -b, -X and -v go before or after the command name.
    """
    ctx.ensure_object(dict)


def settings_of(ctx: click.Context) -> KmqSettings:
    """The settings ``KMQ_*`` and the connection options describe.

    Raises:
        ConfigError: a malformed value.
    """
    given = ctx.find_root().ensure_object(dict)
    return KmqSettings.from_env(
        bootstrap_servers=given.get("bootstrap_servers"),
        client_config=parse_client_options(given.get("client_options", [])),
    )


def verbose(ctx: click.Context) -> bool:
    return bool(ctx.find_root().ensure_object(dict).get("verbose"))


def configure_logging(
    *,
    verbose: bool = False,
    quiet: bool = False,
    log_file: Path | None = None,
    as_json: bool | None = None,
) -> None:
    """Logs on stderr: INFO (WARNING when ``quiet``, for commands whose own progress display is
    their report), DEBUG and the Kafka client's with ``verbose``; everything from INFO on also
    into ``log_file`` when given. ``as_json`` (default: as ``--log-json`` left it) writes one
    JSON object per line."""
    root = logging.getLogger()
    if as_json is None:
        as_json = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    formatter: logging.Formatter = (
        JsonFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(formatter)
    if not verbose:
        stderr.addFilter(quiet_py4j_root)
    stderr.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
    root.addHandler(stderr)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if log_file is not None:
        private_folder(log_file.parent)
        to_file = logging.FileHandler(log_file)
        to_file.setFormatter(formatter)
        if not verbose:
            to_file.addFilter(quiet_py4j_root)
        to_file.setLevel(logging.DEBUG if verbose else logging.INFO)
        root.addHandler(to_file)
    # librdkafka reports connection failures itself; without -v kmq reports them as one line.
    logging.getLogger("kmq.kafka.client").setLevel(
        logging.DEBUG if verbose else logging.CRITICAL + 1
    )
    # Migrations are applied on first use; say so only when asked. py4j chatters at INFO, and
    # so does the schema registry client's HTTP library (a line per request).
    for chatty in ("alembic", "py4j", "httpx", "httpx2", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.DEBUG if verbose else logging.WARNING)


#: Where py4j's modules are: it logs some INFO through the root logger itself.
_PY4J_DIR = f"{os.sep}py4j{os.sep}"


def quiet_py4j_root(record: logging.LogRecord) -> bool:
    """A handler filter: drops py4j's INFO and DEBUG that it logs through the root logger
    (``logging.info(...)``, not its ``py4j`` loggers), such as "Exception while sending
    command." with a whole traceback when Spark's JVM is already gone."""
    return (
        record.levelno >= logging.WARNING
        or record.name != "root"
        or _PY4J_DIR not in record.pathname
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``
    and, for an exception, ``error``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def error_line(exc: BaseException) -> str:
    """The one line an error prints as, secrets masked, the option at fault named."""
    message = str(exc)
    if isinstance(exc, ConfigError) and exc.setting in OPTION_FOR_SETTING:
        option = OPTION_FOR_SETTING[exc.setting]
        if not message.startswith(option):
            message = f"{option}: {message}"
    return mask_text(" ".join(message.split()) if "\n" not in message else message)


def _usage_error(exc: click.UsageError) -> int:
    hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
    message = exc.format_message()
    if isinstance(exc, click.NoSuchOption) and exc.option_name in QUEUE_DEFINITION_OPTIONS:
        # The option of an older kmq: the queue's stored definition holds it now.
        message = QUEUE_DEFINITION_HINT.format(option=exc.option_name)
    click.echo(f"kmq: error: {mask_text(message)}{hint}", err=True)
    return EXIT_USAGE


def _bad_value_line(exc: click.BadParameter) -> str:
    """``--option: what is wrong`` for a value click or one of kmq's types refused."""
    option = exc.param_hint
    if exc.param is not None and exc.param.opts:
        option = max(exc.param.opts, key=len)
    prefix = f"{option}: " if isinstance(option, str) and option else ""
    return mask_text(f"{prefix}{exc.message}{BAD_VALUE_HINT.get(str(option), '')}")


def supervised(argv: Sequence[str] | None) -> bool:
    """Whether a guarded command (``kmq tracker``) runs under ``kmq_dagster.crash_guard``: in
    the real ``kmq`` process on Linux (``argv`` is ``None``), not in a supervised child, not
    when ``main([...])`` is called from Python."""
    return argv is None and sys.platform == "linux" and CHILD_ENV not in os.environ


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kmq`` console script; errors print as one line, not a traceback.

    Returns:
        0, :data:`EXIT_ERROR` for errors, :data:`EXIT_USAGE` for a malformed command line, 130
        after Ctrl-C (also when a long-running command then stopped cleanly), or the exit code
        a worker's handler asked for.
    """

    configure_logging()
    args = list(sys.argv[1:] if argv is None else argv)
    register_argv_secrets(args, cli)  # before click, whose usage errors may echo them
    undecodable = first_undecodable_argument(args, cli)
    if undecodable is not None:
        click.echo(f"kmq: error: {undecodable}", err=True)
        return EXIT_ERROR
    try:
        result = cli.main(
            args=args,
            prog_name="kmq",
            standalone_mode=False,
            obj={"argv": args, "crash_guard": supervised(argv)},
        )
    except click.exceptions.NoArgsIsHelpError as exc:  # plain `kmq`: the help text
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return 0
    except click.BadParameter as exc:
        if isinstance(exc, click.MissingParameter):  # a malformed command line
            return _usage_error(exc)
        click.echo(f"kmq: error: {_bad_value_line(exc)}", err=True)  # a bad value: an error
        return EXIT_ERROR
    except click.UsageError as exc:
        return _usage_error(exc)
    except click.ClickException as exc:
        click.echo(f"kmq: error: {mask_text(exc.format_message())}", err=True)
        return exc.exit_code
    except click.Abort:
        click.echo("kmq: aborted", err=True)
        return EXIT_INTERRUPTED
    except KmqError as exc:
        click.echo(f"kmq: error: {error_line(exc)}", err=True)
        return EXIT_ERROR
    code = result if isinstance(result, int) else 0
    return code or stop_exit_code()  # a handler's exit(N) wins over the signal
