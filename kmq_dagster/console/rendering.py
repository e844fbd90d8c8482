"""How message bytes are shown: pretty JSON, text or a hex dump, always masked, always as data.

Nothing here produces HTML or markdown. The pages show these strings through elements that
render text literally (``st.code``, ``st.text``, ``st.json``, ``st.dataframe``), so a value
holding ``<script>`` or ``**bold**`` is shown exactly as stored.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.console.masking import Masker

JSON, TEXT, BINARY, EMPTY = "json", "text", "binary", "empty"
#: Bytes per line of a hex dump.
HEX_WIDTH = 16
#: Longest value preview in a table cell.
PREVIEW_CHARS = 120

#: Characters Streamlit's markdown gives a meaning (markdown, HTML tags, LaTeX, emoji codes).
_MARKDOWN_SPECIAL = set("\\`*_{}[]()#+-.!|<>~$:=&")

#: Control characters no text value holds: a value with one is shown as binary.
_BINARY_CONTROL = frozenset(code for code in [*range(32), 127] if chr(code) not in "\t\n\r")
_CONTROL = {code: "\N{REPLACEMENT CHARACTER}" for code in [*range(32), 127] if code not in (9,)}


@dataclass(frozen=True)
class ValueView:
    """One value, ready to show: its kind and the masked forms a page offers."""

    kind: str
    #: The parsed JSON with sensitive fields masked (JSON values only).
    document: Any
    #: Text (pretty JSON for JSON values), masked.
    text: str
    #: Hex dump of the shown bytes (the masked JSON for a masked JSON value).
    hex: str
    masked_fields: int = 0


def view_value(raw: bytes | None, masker: Masker) -> ValueView:
    """The views of a stored value: JSON if it parses, text if it is UTF-8, else binary."""
    if raw is None or raw == b"":
        return ValueView(EMPTY, None, "", "")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or any(ord(char) in _BINARY_CONTROL for char in text):
        return ValueView(BINARY, None, raw.decode("utf-8", errors="replace"), hex_dump(raw))
    try:
        document = json.loads(text)
    except ValueError:
        return ValueView(TEXT, None, text, hex_dump(raw))
    masked, count = masker.json(document)
    pretty = json.dumps(masked, indent=2, ensure_ascii=False)
    shown = raw if count == 0 else json.dumps(masked, ensure_ascii=False).encode()
    return ValueView(JSON, masked, pretty, hex_dump(shown), count)


def preview(raw: bytes | None, masker: Masker) -> str:
    """One line for a table cell: compact masked JSON, text, or the start of a hex dump."""
    view = view_value(raw, masker)
    if view.kind == JSON:
        line = json.dumps(view.document, ensure_ascii=False)
    elif view.kind == BINARY:
        line = "0x" + (raw or b"")[: PREVIEW_CHARS // 2].hex()
    else:
        line = view.text
    line = line.translate(_CONTROL)
    return (
        line
        if len(line) <= PREVIEW_CHARS
        else line[: PREVIEW_CHARS - 1] + "\N{HORIZONTAL ELLIPSIS}"
    )


def escape_markdown(text: str) -> str:
    """``text`` with every character markdown could interpret backslash-escaped, for the few
    places that render markdown (alerts, captions) and must show data literally."""
    return "".join("\\" + char if char in _MARKDOWN_SPECIAL else char for char in text)


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
    if view.kind == JSON:
        value = view.document
    elif view.kind == BINARY:
        value = {"base64": base64.b64encode(dead_letter.value or b"").decode("ascii")}
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
