"""How message bytes are shown: pretty JSON, text or a hex dump, always masked, always as data.

Nothing here produces HTML or markdown. The pages show these strings through elements that
render text literally (``st.code``, ``st.text``, ``st.json``, ``st.dataframe``), or escaped
for the ones that render markdown (``st.table``: :func:`static_table`), so a value holding
``<script>`` or ``**bold**`` is shown exactly as stored.
"""

from __future__ import annotations

import ast
import base64
import json
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.console.masking import Masker

JSON, TEXT, BINARY, EMPTY = "json", "text", "binary", "empty"
#: Bytes per line of a hex dump.
HEX_WIDTH = 16
#: Longest value preview in a table cell.
PREVIEW_CHARS = 120
#: How much of a value a table cell's preview reads: masking its start masks what the cell
#: shows exactly as masking the whole value would (a secret's value starts after its name).
PREVIEW_SOURCE_BYTES = 4_096
#: Deepest JSON shown as a tree or exported as a document; deeper JSON is shown as (masked)
#: text, so no renderer, encoder or browser walks 500 levels of nesting.
MAX_TREE_DEPTH = 64
BYTE_ORDER_MARK = "\N{ZERO WIDTH NO-BREAK SPACE}"

#: Characters Streamlit's markdown gives a meaning (markdown, HTML tags, LaTeX, emoji codes).
_MARKDOWN_SPECIAL = set("\\`*_{}[]()#+-.!|<>~$:=&")

#: Control characters no text value holds: a value with one is shown as binary.
_BINARY_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CONTROL = {code: "\N{REPLACEMENT CHARACTER}" for code in [*range(32), 127] if code not in (9,)}
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class ValueView:
    """One value, ready to show: its kind and the masked forms a page offers."""

    kind: str
    #: The parsed JSON with sensitive fields masked (JSON values only).
    document: Any
    #: Text (pretty JSON for JSON values), masked.
    text: str
    #: The value's bytes with sensitive fields masked: what the hex view and exports show.
    shown: bytes = b""
    masked_fields: int = 0
    #: Why the value is shown the way it is, when that is not obvious (deep nesting, a BOM).
    note: str = ""

    @property
    def hex(self) -> str:
        """Hex dump of the masked bytes (made only when a page asks for it)."""
        return hex_dump(self.shown)


def view_value(raw: bytes | None, masker: Masker) -> ValueView:
    """The views of a stored value, masked first: JSON if it parses (behind a byte-order mark
    too) and is at most :data:`MAX_TREE_DEPTH` deep, text if it is UTF-8, else binary. Never
    raises on any input, whatever its size, shape or encoding."""
    if raw is None or raw == b"":
        return ValueView(EMPTY, None, "", b"")
    shown, count = masker.mask_bytes(raw)
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or _BINARY_CONTROL.search(text):
        readable = shown.decode("utf-8", errors="replace")
        return ValueView(BINARY, None, readable, shown, count, "not UTF-8 text: shown as hex")
    body = text.removeprefix(BYTE_ORDER_MARK)
    bom_note = "JSON behind a byte-order mark" if text.startswith(BYTE_ORDER_MARK) else ""
    if json_depth(body, MAX_TREE_DEPTH) > MAX_TREE_DEPTH:
        note = f"JSON nested more than {MAX_TREE_DEPTH} levels deep: shown as text"
        return ValueView(TEXT, None, text, shown, count, note)
    try:
        document = json.loads(body)
        pretty = json.dumps(document, indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return ValueView(TEXT, None, text, shown, count)
    return ValueView(JSON, document, pretty, shown, count, bom_note)


def json_depth(text: str, limit: int) -> int:
    """How deep the brackets of ``text`` nest (strings skipped), counted up to ``limit + 1``."""
    depth = deepest = 0
    for found in _STRUCTURE.finditer(text):
        char = found.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif char in "]}":
            depth -= 1
    return deepest


def preview(raw: bytes | None, masker: Masker) -> str:
    """One line for a table cell: compact masked JSON, text, or the start of a hex dump."""
    cut = raw is not None and len(raw) > PREVIEW_SOURCE_BYTES
    view = view_value(utf8_prefix(raw, PREVIEW_SOURCE_BYTES) if cut else raw, masker)
    if view.kind == JSON:
        line = json.dumps(view.document, ensure_ascii=False)
    elif view.kind == BINARY:
        line = "0x" + view.shown[: PREVIEW_CHARS // 2].hex()
    else:
        line = _SPACES.sub(" ", view.text) if cut or view.note else view.text
    return _cut_line(line.translate(_CONTROL))


def row_preview(dead_letter: DeadLetter, masker: Masker) -> str:
    """A dead letter's value for a table cell: :func:`preview`, or for a Schema Registry value
    that could not be decoded, a placeholder and the start of its bytes in hex."""
    if dead_letter.value_undecodable is None:
        return preview(dead_letter.value, masker)
    schema_id = dead_letter.schema_id
    placeholder = "(undecodable" + (f", schema id {schema_id})" if schema_id is not None else ")")
    return _cut_line(f"{placeholder} 0x{(dead_letter.value or b'').hex()}")


def _cut_line(line: str) -> str:
    if len(line) <= PREVIEW_CHARS:
        return line
    return line[: PREVIEW_CHARS - 1] + "\N{HORIZONTAL ELLIPSIS}"


def undecodable_text(dead_letter: DeadLetter) -> str:
    """What a Schema Registry value that could not be decoded says about itself."""
    schema_id = dead_letter.schema_id
    which = f" (schema id {schema_id})" if schema_id is not None else ""
    return f"Undecodable Schema Registry value{which}: {dead_letter.value_undecodable}"


def schema_text(dead_letter: DeadLetter) -> str:
    """A Schema Registry value's format, subject, version and schema id in words (empty for
    any other value): ``avro, subject orders-value version 2 (schema id 7)``."""
    if dead_letter.schema_id is None:
        return ""
    words = [dead_letter.value_format or "format unknown"]
    if dead_letter.schema_subject:
        version = dead_letter.schema_version
        words.append(f"subject {dead_letter.schema_subject}"
                     + (f" version {version}" if version is not None else ""))  # fmt: skip
    return ", ".join(words) + f" (schema id {dead_letter.schema_id})"


def utf8_prefix(raw: bytes | None, size: int) -> bytes:
    """The first ``size`` bytes of ``raw`` or fewer, never ending inside a UTF-8 character."""
    data = raw or b""
    if len(data) <= size:
        return data
    end = size
    while end > size - 3 and end > 0 and data[end] & 0xC0 == 0x80:
        end -= 1
    return data[:end]


def escape_markdown(text: str) -> str:
    """``text`` with every character markdown could interpret backslash-escaped, for the few
    places that render markdown (alerts, captions) and must show data literally."""
    return "".join("\\" + char if char in _MARKDOWN_SPECIAL else char for char in text)


def static_table(rows: list[dict[str, object]]) -> pd.DataFrame:
    """``rows`` for ``st.table``, which renders a text cell as markdown: every text escaped
    (:func:`escape_markdown`), so ``-`` shows as a dash, not an empty list, and ``->`` or
    ``**`` in an alert show as written."""
    return pd.DataFrame(
        [{k: escape_markdown(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    )


def hex_dump(raw: bytes) -> str:
    """Offset, hex bytes and printable ASCII, 16 bytes a line."""
    lines = []
    for start in range(0, len(raw), HEX_WIDTH):
        chunk = raw[start : start + HEX_WIDTH]
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {chunk.hex(' '):<{HEX_WIDTH * 3 - 1}}  |{shown}|")
    return "\n".join(lines)


def key_text(key: bytes | None) -> str:
    """A key as text if it is printable UTF-8, else ``0x`` and its hex."""
    if key is None:
        return ""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + key.hex()
    return text if text.isprintable() else "0x" + key.hex()


#: A dry run's sample line (``kmq_dagster.operations.replay``): position, key as Python shows
#: bytes (or None), error type.
_SAMPLE_LINE = re.compile(
    r"^(?P<at>\S+\[\d+\]@\d+) key=(?P<key>None|b'(?:[^'\\]|\\.)*'|b\"(?:[^\"\\]|\\.)*\") "
    r"(?P<error_type>.*)$",
    re.DOTALL,
)


def sample_rows(lines: list[str]) -> list[dict[str, str]]:
    """A dry run's sample as table rows (DLQ position, key, error type), keys shown as the
    Dead letters page shows them (:func:`key_text`); a line of another shape is kept whole
    as the position."""
    rows = []
    for line in lines:
        found = _SAMPLE_LINE.match(line)
        if found is None:
            rows.append({"DLQ position": line, "key": "", "error type": ""})
            continue
        key = ast.literal_eval(found["key"])  # a bytes or None literal, nothing else matches
        rows.append(
            {"DLQ position": found["at"], "key": key_text(key), "error type": found["error_type"]}
        )
    return rows


def header_rows(dead_letter: DeadLetter, masker: Masker) -> list[dict[str, str]]:
    """The stored headers as table rows (name, value, encoding), sensitive values masked."""
    rows = []
    for name, value, is_base64 in dead_letter.headers or []:
        shown = masker.header_value(str(name), None if value is None else str(value))
        encoding = "none" if value is None else "base64" if is_base64 else "utf-8"
        rows.append({"name": str(name), "value": shown or "", "encoding": encoding})
    return rows


def export(dead_letter: DeadLetter, masker: Masker) -> dict[str, Any]:
    """A dead letter as a JSON-ready dict for download, masked like the views."""
    view = view_value(dead_letter.value, masker)
    value: Any
    if dead_letter.value_undecodable is not None:
        value = {"undecodable": undecodable_text(dead_letter), "hex": view.shown.hex()}
    elif view.kind == JSON:
        value = view.document
    elif view.kind == BINARY:
        value = {"base64": base64.b64encode(view.shown).decode("ascii")}
    else:
        value = view.text
    return {
        "id": dead_letter.id,
        "dlq": [dead_letter.dlq_topic, dead_letter.dlq_partition, dead_letter.dlq_offset],
        "queue_topic": dead_letter.queue_topic,
        "group_id": dead_letter.group_id,
        "key": key_text(dead_letter.key),
        "value": value,
        "value_size": dead_letter.value_size,
        "value_truncated": dead_letter.value_truncated,
        "value_masked_fields": view.masked_fields,
        "value_format": dead_letter.value_format,
        "schema": {"id": dead_letter.schema_id, "subject": dead_letter.schema_subject,
                   "version": dead_letter.schema_version},
        "headers": header_rows(dead_letter, masker),
        "error_type": dead_letter.error_type,
        "error_message": dead_letter.error_message,
        "reason": dead_letter.reason,
        "attempts": dead_letter.attempts,
        "original": [dead_letter.original_topic, dead_letter.original_partition,
                     dead_letter.original_offset],
        "first_failure_at": dead_letter.first_failure_at.isoformat(),
        "last_failure_at": dead_letter.last_failure_at.isoformat(),
        "status": dead_letter.status,
    }  # fmt: skip
