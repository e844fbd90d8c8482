"""``kmq send``: messages from arguments, files or stdin, checked before the first is sent.

An argument is text; Kafka data is bytes. ``--value``, ``--key`` and ``--header`` take UTF-8
text; ``--value-file``, ``--key-file`` and ``--header-file`` take any bytes, a file's whole
content each; stdin gives one message per line, bytes as they are. Every message is checked
against the producer's size limit before anything is sent, so a command that fails has sent
nothing; and every message the broker refuses is reported, never counted as sent.

``--encode avro|json-schema|json`` encodes each message, given as JSON text, before
anything is sent: ``avro`` and ``json-schema`` in the Schema Registry wire format
(``KMQ_SCHEMA_REGISTRY_URL``), with ``--schema-file``'s schema (registered under
``<topic>-value`` if new) or, without it, the subject's latest registered one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from kmq_dagster.cli.app import cli, connection_options, settings_of
from kmq_dagster.cli.options import topic_option
from kmq_dagster.cli.value_types import Duration
from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.wording import counted
from kmq_dagster.errors import ConfigError, DeliveryError
from kmq_dagster.settings import MAX_PRODUCER_MESSAGE_MAX_BYTES

#: Bytes a header adds beyond its name and value (lengths and attributes, as varints).
HEADER_OVERHEAD_BYTES = 10
#: Room for the headers ``--delay`` adds (due time, delay level, original topic).
DELAY_HEADERS_BYTES = 256

_readable_file = click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)


@cli.command()
@topic_option
@click.option(
    "--value",
    "values",
    multiple=True,
    help="A message (UTF-8 text); repeat for more [default: stdin, one per line, bytes as given].",
)
@click.option(
    "--value-file",
    "value_files",
    multiple=True,
    type=_readable_file,
    metavar="PATH",
    help="A message: the file's bytes, exactly; repeatable, sent after the --value ones.",
)
@click.option("--key", "-k", help="Key of every message sent (UTF-8 text).")
@click.option(
    "--key-file",
    type=_readable_file,
    metavar="PATH",
    help="Key of every message: the file's bytes.",
)
@click.option(
    "--header", "headers", multiple=True, metavar="NAME=VALUE", help="Header; repeatable."
)
@click.option(
    "--header-file",
    "header_files",
    multiple=True,
    metavar="NAME=PATH",
    help="Header whose value is the file's bytes; repeatable.",
)
@click.option(
    "--delay",
    type=Duration(min_ms=1_000, max_ms=7 * 86_400_000),
    metavar="DURATION",
    help="Deliver after this long (1s to 7d, e.g. 90s, 2h); needs `kmq delayer`.",
)
@click.option(
    "--encode",
    "value_format",
    type=click.Choice(["bytes", "json", "avro", "json-schema"]),
    default="bytes",
    show_default=True,
    help="Encode each message, given as JSON text, in this format before sending; avro and "
    "json-schema use the schema registry [env KMQ_SCHEMA_REGISTRY_URL].",
)
@click.option(
    "--schema-file",
    type=_readable_file,
    metavar="PATH",
    help="The avro or json-schema schema to encode with (registered under TOPIC-value if new) "
    "[default: the subject's latest registered schema].",
)
@connection_options
@click.pass_context
def send(
    ctx: click.Context,
    topic: str,
    values: tuple[str, ...],
    value_files: tuple[Path, ...],
    key: str | None,
    key_file: Path | None,
    headers: tuple[str, ...],
    header_files: tuple[str, ...],
    delay: int | None,
    value_format: str,
    schema_file: Path | None,
) -> None:
    """Send messages to TOPIC, now or after --delay."""
    from kmq_dagster.kafka.producer import KmqProducer

    if key is not None and key_file is not None:
        raise click.UsageError("give --key or --key-file, not both")
    settings = settings_of(ctx)
    producer = KmqProducer(settings)  # refuses a bad -X setting by name
    limit = int(settings.producer_config()["message.max.bytes"])
    pairs = [_header(text, "--header") for text in headers]
    pairs += [_header(text, "--header-file") for text in header_files]
    key_bytes = key_file.read_bytes() if key_file is not None else _encoded(key)
    fixed = len(key_bytes or b"") + sum(
        len(name.encode()) + len(value) + HEADER_OVERHEAD_BYTES for name, value in pairs
    )
    fixed += DELAY_HEADERS_BYTES if delay else 0
    for path in value_files:
        _check_size(path.stat().st_size + fixed, limit, f"--value-file {path}")
    messages = [value.encode() for value in values] + [path.read_bytes() for path in value_files]
    if not values and not value_files:  # bytes: any payload is a message
        messages = [line.rstrip(b"\r\n") for line in sys.stdin.buffer]
    if schema_file is not None and value_format not in ("avro", "json-schema"):
        raise click.UsageError("--schema-file goes with --encode avro or json-schema")
    codec = _codec(value_format, settings, topic) if value_format != "bytes" else None
    for number, message in enumerate(messages, start=1):
        where = f"message {number}" if values or value_files else f"stdin line {number}"
        if codec is not None:  # encoded before anything is sent: a bad one sends nothing
            messages[number - 1] = _encoded_value(message, where, codec, schema_file)
        _check_size(len(messages[number - 1]) + fixed, limit, where)

    failures: list[Any] = []

    def remember_failure(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    for message in messages:
        producer.send(
            topic,
            message,
            key=key_bytes,
            headers=pairs,
            delay=None if delay is None else delay / 1000,
            on_delivery=remember_failure,
        )
    pending = producer.flush()
    if pending or failures:
        raise DeliveryError(_not_sent(len(messages), pending, failures))
    when = ""
    if delay:
        when = f", due in {format_duration_ms(delay)}; `kmq delayer --topic {topic}` delivers them"
        smallest_ms = producer.delay_levels_ms(topic)[0]
        if delay < smallest_ms:  # the ladder's precision: late, never early
            when += (
                f" after about {format_duration_ms(smallest_ms)}, the smallest delay level of "
                f"{topic}"
            )
    click.echo(f"sent {len(messages)} message{'' if len(messages) == 1 else 's'} to {topic}{when}")


def _codec(value_format: str, settings: Any, topic: str) -> Any:
    from kmq_dagster.schemas.codec import ValueCodec

    return ValueCodec(value_format, settings.schema_registry, topic=topic)


def _encoded_value(message: bytes, where: str, codec: Any, schema_file: Path | None) -> bytes:
    """``message`` (JSON text) encoded by ``codec``.

    Raises:
        ConfigError: not JSON, or not fitting the schema.
        RegistryUnavailable: the registry did not answer.
    """
    try:
        value = json.loads(message)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where} is not JSON text ({exc}): --encode takes JSON text") from None
    schema = schema_file.read_text() if schema_file is not None else None
    return bytes(codec.encode(value, schema=schema))


def _encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _header(text: str, option: str) -> tuple[str, bytes]:
    """``NAME=VALUE`` (``--header``) or ``NAME=PATH`` (``--header-file``) as a header."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        what = "PATH" if option == "--header-file" else "VALUE"
        raise click.BadParameter(f"expected NAME={what}, got {text!r}", param_hint=option)
    if option == "--header":
        return name, value.encode()
    path = Path(value)
    if not path.is_file():
        raise click.BadParameter(f"{value!r} is not a readable file", param_hint=option)
    return name, path.read_bytes()


def _check_size(size_bytes: int, limit_bytes: int, where: str) -> None:
    """Refuse a message the producer would refuse, before anything is sent.

    Raises:
        ConfigError: the message (with its key and headers) is over ``limit_bytes``.
    """
    if size_bytes <= limit_bytes:
        return
    raise ConfigError(
        f"{where}: {size_bytes:,} bytes with key and headers is over the producer's limit of "
        f"{limit_bytes:,} bytes; raise it with -X message.max.bytes=N (at most "
        f"{MAX_PRODUCER_MESSAGE_MAX_BYTES:,}), and the topic's max.message.bytes and the "
        "broker's message.max.bytes to match"
    )


def _not_sent(total: int, pending: int, failures: list[Any]) -> str:
    """What the broker did not acknowledge, and why (its first refusal)."""
    refused = len(failures)
    line = f"{refused + pending} of {counted(total, 'message')} were not acknowledged by Kafka"
    if failures:
        first = failures[0]
        line += f": {first.str()}"
        if first.name() == "MSG_SIZE_TOO_LARGE":
            line += (
                " (the broker's limit: raise the topic's max.message.bytes or the broker's "
                "message.max.bytes)"
            )
    return line
