"""Schema Registry values: the formats a queue may declare, the registry client kmq uses, and
the Confluent wire format (magic byte 0, a 4-byte big-endian schema id, then the payload).

Everything here talks to a registry through confluent-kafka's ``SchemaRegistryClient`` only, as
it would to a real one (``mock://`` URLs give confluent-kafka's in-process mock). The serializers
come from the ``schemas`` extra: ``pip install -e '.[schemas]'`` in the clone (the test extra
has it).
"""

from kmq_dagster.schemas.formats import ValueFormat, parse_value_format
from kmq_dagster.schemas.registry import RegistrySettings, registry_client
from kmq_dagster.schemas.wire import (
    MAGIC_BYTE,
    RegistryUnavailable,
    UndecodableValue,
    framed_schema_id,
)

__all__ = [
    "MAGIC_BYTE",
    "RegistrySettings",
    "RegistryUnavailable",
    "UndecodableValue",
    "ValueFormat",
    "framed_schema_id",
    "parse_value_format",
    "registry_client",
]
