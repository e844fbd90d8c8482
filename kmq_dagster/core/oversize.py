"""Messages too large to copy: dead-lettered as a reference to where their bytes are.

A record kmq could read but cannot copy (to a retry topic, the redelivery topic or the DLQ)
because the producer or the broker refuses its size is still data (invariant 7): it goes to
the DLQ as a *reference*, a record with an empty value whose headers keep the key's user
headers, the failure headers, and say where the bytes are (:data:`VALUE_REF`), how large the
record was (:data:`OVERSIZE_BYTES`) and why (``kmq-dlq-reason``). Replaying a reference reads
the record at those coordinates, while the topic still retains it, and copies its value.
"""

from __future__ import annotations

from dataclasses import dataclass

from kmq_dagster.core.headers import DLQ_REASON, Headers, header_value

#: Where the value of a reference dead letter is: ``<topic>/<partition>/<offset>``.
VALUE_REF = "kmq-value-ref"
#: Size of the record that could not be copied (key, value and headers), in bytes.
OVERSIZE_BYTES = "kmq-oversize-bytes"
#: Headers only a reference carries; a resolved copy drops them.
REFERENCE_HEADERS = (VALUE_REF, OVERSIZE_BYTES)


@dataclass(frozen=True)
class ValueRef:
    """The coordinates of a record whose value a reference dead letter stands for."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        # Topic names never contain "/" (Kafka allows letters, digits, ".", "_" and "-").
        return f"{self.topic}/{self.partition}/{self.offset}"

    def describe(self) -> str:
        """As operators read coordinates elsewhere: ``orders [0] @ 17``."""
        return f"{self.topic} [{self.partition}] @ {self.offset}"


@dataclass(frozen=True)
class Reference:
    """What a reference dead letter says: where the bytes are and how many there were."""

    ref: ValueRef
    size_bytes: int


def record_size(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """Bytes of a record's key, value and headers (names and values): what a size limit
    weighs, without the few bytes of framing."""
    size = len(key or b"") + len(value or b"")
    for name, header in headers or ():
        size += len(name.encode()) + len(header or b"")
    return size


def oversize_reason(size_bytes: int, target: str, refusal: str, ref: ValueRef) -> str:
    """The ``kmq-dlq-reason`` of a reference dead letter."""
    return (
        f"too large to copy: a record of {size_bytes:,} bytes was refused for {target} "
        f"({refusal}); dead-lettered as a reference to {ref.describe()}"
    )


def reference_updates(ref: ValueRef, size_bytes: int, reason: str) -> dict[str, str]:
    """The headers that make a dead letter a reference (pass to ``replace_headers``)."""
    return {VALUE_REF: str(ref), OVERSIZE_BYTES: str(size_bytes), DLQ_REASON: reason}


def parse_value_ref(text: str) -> ValueRef:
    """``<topic>/<partition>/<offset>`` back into a :class:`ValueRef`.

    Raises:
        ValueError: not of that form.
    """
    topic, _, rest = text.partition("/")
    partition, _, offset = rest.partition("/")
    if not topic or not partition.isdigit() or not offset.isdigit():
        raise ValueError(f"{VALUE_REF} is not TOPIC/PARTITION/OFFSET: {text!r}")
    return ValueRef(topic, int(partition), int(offset))


def reference_of(headers: Headers | None) -> Reference | None:
    """The reference a dead letter's headers make, or ``None`` for an ordinary dead letter.

    Raises:
        ValueError: a :data:`VALUE_REF` header that cannot be read.
    """
    raw = header_value(headers, VALUE_REF)
    if raw is None:
        return None
    try:
        ref = parse_value_ref(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{VALUE_REF} is not UTF-8") from None
    size = header_value(headers, OVERSIZE_BYTES)
    size_bytes = int(size) if size is not None and size.isdigit() else 0
    return Reference(ref, size_bytes)
