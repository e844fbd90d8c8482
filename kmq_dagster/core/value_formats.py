"""The value (and key) formats a queue may declare: part of its stored definition."""

from __future__ import annotations

from enum import StrEnum

from kmq_dagster.errors import ConfigError


class ValueFormat(StrEnum):
    """How a queue's values (or keys) are encoded."""

    #: Opaque bytes: kmq never looks inside (the default).
    BYTES = "bytes"
    #: UTF-8 JSON text, no registry.
    JSON = "json"
    #: Avro in the Schema Registry wire format.
    AVRO = "avro"
    #: Protobuf in the Schema Registry wire format (with its message-index list).
    PROTOBUF = "protobuf"
    #: JSON Schema in the Schema Registry wire format.
    JSON_SCHEMA = "json-schema"

    @property
    def uses_registry(self) -> bool:
        """Whether values of this format carry a schema id and need a registry to decode."""
        return self in (ValueFormat.AVRO, ValueFormat.PROTOBUF, ValueFormat.JSON_SCHEMA)


def parse_value_format(text: str, *, setting: str = "value_format") -> ValueFormat:
    """The format named ``text`` (case-insensitive; ``json_schema`` is ``json-schema``).

    Raises:
        ConfigError: ``text`` names no format; the message lists the ones there are.
    """
    name = text.strip().lower().replace("_", "-")
    try:
        return ValueFormat(name)
    except ValueError:
        choices = ", ".join(f.value for f in ValueFormat)
        raise ConfigError(
            f"unknown {setting.replace('_', ' ')} {text!r}: use one of {choices}", setting=setting
        ) from None
