"""The Confluent Schema Registry wire format, and the two ways decoding a value can fail.

A framed value is ``0x00``, the schema id as 4 big-endian bytes, then the payload (Protobuf adds
a list of message indexes before its payload). Whether a failure is the message's fault decides
where it goes:

* :class:`UndecodableValue` is **fatal** for that message (it goes to the DLQ with the reason):
  no magic byte, too short, a schema id the registry does not know, a payload that does not fit
  its schema. Retrying cannot help.
* :class:`RegistryUnavailable` is **retryable**: the registry did not answer, timed out, refused
  the credentials or answered 5xx. The message is fine; it is retried later like any failure.
"""

from __future__ import annotations

from kmq_dagster.errors import KmqError

#: The first byte of every Schema Registry framed value.
MAGIC_BYTE = 0
#: The magic byte and the 4-byte schema id.
HEADER_LENGTH = 5


class UndecodableValue(KmqError):
    """A value cannot be decoded, whatever is retried: its reason goes to the DLQ."""


class RegistryUnavailable(KmqError):
    """The schema registry could not be asked; the value may be fine (retry it later)."""


def framed_schema_id(raw: bytes | None) -> int:
    """The schema id of a Schema Registry framed value.

    Raises:
        UndecodableValue: ``raw`` is empty, shorter than the 5-byte header, or does not start
            with the magic byte 0 (the message says which byte it found).
    """
    if not raw:
        raise UndecodableValue("no value: a Schema Registry value has at least 5 bytes")
    if raw[0] != MAGIC_BYTE:
        raise UndecodableValue(
            f"not in the Schema Registry wire format: first byte 0x{raw[0]:02x}, expected 0x00"
        )
    if len(raw) < HEADER_LENGTH:
        raise UndecodableValue(
            f"too short for the Schema Registry wire format: {len(raw)} bytes, at least 5"
        )
    return int.from_bytes(raw[1:HEADER_LENGTH], "big")
