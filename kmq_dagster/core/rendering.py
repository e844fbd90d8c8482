"""Message bytes as a person reads them: pretty JSON, text, or a hex dump (pure)."""

from __future__ import annotations

import json

#: Bytes shown at most; the rest is counted, not printed.
MAX_SHOWN_BYTES = 4096


def render_bytes(value: bytes | None, max_bytes: int = MAX_SHOWN_BYTES) -> tuple[str, str]:
    """``(kind, text)``: kind is ``null``, ``json``, ``text`` or ``binary``; text is indented
    JSON, the decoded text, or a hex dump of 16 bytes a line. Never markup: callers print it
    as plain text."""
    if value is None:
        return "null", ""
    shown = value[:max_bytes]
    cut = f"\n... {len(value) - max_bytes:,} more bytes" if len(value) > max_bytes else ""
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        return "binary", hex_dump(shown) + cut
    if not cut:
        try:
            return "json", json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            pass
    return "text", text + cut


def hex_dump(data: bytes) -> str:
    """``00000000  7b 22 69 64 ...  {"id...``: offset, 16 bytes in hex, printable ASCII."""
    lines = []
    for start in range(0, len(data), 16):
        chunk = data[start : start + 16]
        hexed = " ".join(f"{byte:02x}" for byte in chunk)
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {hexed:<47}  {printable}")
    return "\n".join(lines)
