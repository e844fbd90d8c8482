"""Message bytes as a person reads them: pretty JSON, text, or a hex dump (pure).

Secret-looking fields are masked (:mod:`kmq_dagster.core.masking`) *before* the value is cut to
what is shown: a JSON value cut short no longer parses, and must not print its secrets in clear.
"""

from __future__ import annotations

import json

from kmq_dagster.core.masking import DEFAULT_MASKER, Masker

#: Bytes shown at most; the rest is counted, not printed.
MAX_SHOWN_BYTES = 4096
#: Deepest JSON pretty-printed; deeper JSON prints as text (Python's indenting encoder
#: recurses once per level and would raise ``RecursionError`` near 500).
MAX_PRETTY_DEPTH = 64


def render_bytes(
    value: bytes | None, max_bytes: int = MAX_SHOWN_BYTES, *, masker: Masker = DEFAULT_MASKER
) -> tuple[str, str]:
    """``(kind, text)``: kind is ``null``, ``json``, ``text`` or ``binary``; text is indented
    JSON, the decoded text, or a hex dump of 16 bytes a line, secrets masked. Never markup:
    callers print it as plain text."""
    if value is None:
        return "null", ""
    shown = masker.cut(value, max_bytes)
    cut = f"\n... {len(value) - max_bytes:,} more bytes" if len(value) > max_bytes else ""
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        return "binary", hex_dump(shown) + cut
    if not cut and _depth_at_most(text, MAX_PRETTY_DEPTH):
        try:
            return "json", json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            pass
    return "text", text + cut


def _depth_at_most(text: str, limit: int) -> bool:
    """Whether brackets nest at most ``limit`` deep (brackets inside strings counted too: a
    conservative answer that only ever turns pretty JSON into plain text)."""
    depth = 0
    for char in text:
        if char in "[{":
            depth += 1
            if depth > limit:
                return False
        elif char in "]}":
            depth -= 1
    return True


def hex_dump(data: bytes) -> str:
    """``00000000  7b 22 69 64 ...  {"id...``: offset, 16 bytes in hex, printable ASCII."""
    lines = []
    for start in range(0, len(data), 16):
        chunk = data[start : start + 16]
        hexed = " ".join(f"{byte:02x}" for byte in chunk)
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {hexed:<47}  {printable}")
    return "\n".join(lines)
