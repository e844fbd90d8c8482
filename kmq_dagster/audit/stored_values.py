"""What the audit store keeps of a dead letter's value: masked, cut, and decoded for reading
when it is a Schema Registry value.

A value in the Schema Registry wire format (first byte 0) is binary: masking cannot see its
field names and the text search cannot find its fields. When a registry is set
(``KMQ_SCHEMA_REGISTRY_URL`` and the other ``KMQ_SCHEMA_REGISTRY_*`` settings, read from the
ingesting process's environment), the ingester decodes it (:mod:`kmq_dagster.schemas.preview`)
and stores its JSON, masked by the same patterns as any JSON value, in ``value``, with its
format, schema id, subject and version: the console, its exports and its text search then read
the decoded, masked fields, and the secret in the binary never reaches the store. The original
bytes stay in the DLQ topic, which is what a replay copies.

A framed value that cannot be decoded (a schema id the registry does not know, a payload that
does not fit its schema, a registry that does not answer) is stored as its bytes, with the
reason in ``value_undecodable``: the console shows a placeholder and the bytes in hex. It is
never dropped or held back: a dead letter stored while the registry was down keeps the
placeholder (the store ignores a record it already holds; the DLQ topic keeps the original
bytes). Without a registry setting, values are stored as before.
"""

from __future__ import annotations

import json
from typing import Any

from kmq_dagster.audit.models import MAX_STORED_VALUE_BYTES
from kmq_dagster.core.masking import Masker
from kmq_dagster.schemas.preview import SchemaPreviewer, is_framed, previewer_from_env
from kmq_dagster.secrets import mask_text as mask_registered

#: The columns :func:`value_columns` fills, empty.
_NO_SCHEMA: dict[str, Any] = {
    "value_format": None,
    "schema_id": None,
    "schema_subject": None,
    "schema_version": None,
    "value_undecodable": None,
}


def stored_value(value: bytes | None, masker: Masker) -> bytes | None:
    """``value`` masked, then cut at :data:`MAX_STORED_VALUE_BYTES`."""
    if value is None:
        return None
    return masker.cut(value, MAX_STORED_VALUE_BYTES)


def value_columns(
    value: bytes | None, masker: Masker, previewer: SchemaPreviewer | None = None
) -> dict[str, Any]:
    """The value columns of a dead letter's row: ``value`` (masked, cut; a Schema Registry
    value's decoded JSON), ``value_truncated`` and the schema columns.

    ``previewer``: a :class:`~kmq_dagster.schemas.preview.SchemaPreviewer` (default: the one
    for the registry the environment names, if any).
    """
    size = len(value) if value is not None else 0
    plain = {
        "value": stored_value(value, masker),
        "value_truncated": size > MAX_STORED_VALUE_BYTES,
        **_NO_SCHEMA,
    }
    if not is_framed(value):
        return plain
    previewer = previewer or previewer_from_env()
    if previewer is None:
        return plain
    assert value is not None  # framed
    preview = previewer.preview(value)
    schema = {
        "value_format": preview.format.value if preview.format else None,
        "schema_id": preview.schema_id,
        "schema_subject": preview.subject[:255] if preview.subject else None,
        "schema_version": preview.version,
    }
    if not preview.decoded:
        # registry error text may quote a URL or credentials; PostgreSQL text refuses NUL
        reason = masker.mask_text(mask_registered(preview.undecodable or ""))[0]
        reason = reason.replace("\x00", "\N{REPLACEMENT CHARACTER}")
        return {**plain, **schema, "value_undecodable": reason}
    decoded = json.dumps(preview.value, ensure_ascii=False).encode("utf-8")
    return {
        **plain,
        **schema,
        "value": stored_value(decoded, masker),
        "value_truncated": len(decoded) > MAX_STORED_VALUE_BYTES,
    }
