"""Message data made safe for a terminal: control characters shown, never obeyed (pure).

A dead letter's key, value, headers and error text come from whoever produced the message.
Written to a terminal as they are, an ``ESC`` starts a control sequence: ``ESC ] 52`` writes
the operator's clipboard, ``ESC [ 2 J`` clears the screen, a carriage return or backspaces
overwrite what was printed before, and C1 controls (``U+0080``-``U+009F``) do the same on
terminals that read them. Bidirectional overrides reorder what is shown. Every such character
is printed as a visible escape (``\\x1b``, ``\\u202e``) instead.

Examples:
    >>> escape_control("a\\x1b]52;c;aGk=\\x07b")
    'a\\\\x1b]52;c;aGk=\\\\x07b'
    >>> escape_control("line 1\\nline 2", keep_newlines=True)
    'line 1\\nline 2'
"""

from __future__ import annotations

import re

#: C0 controls but tab and newline, DEL, C1 controls, bidirectional overrides and isolates,
#: invisible characters that make two different texts look alike (zero width space, word
#: joiner, byte-order mark), and lone surrogates (undecodable bytes Python kept, which no
#: terminal encoding can print). Zero width (non-)joiners are kept: emoji and scripts use them.
_UNSAFE = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u202a-\u202e\u2060\u2066-\u2069"
    "\ufeff\ud800-\udfff"
)
_UNSAFE_IN_BLOCK = re.compile(f"[{_UNSAFE}]")
_UNSAFE_IN_LINE = re.compile(f"[{_UNSAFE}\t\n]")


def escape_control(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal would obey shown as an escape.

    Args:
        text: message data (a key, a header, a reason, a value).
        keep_newlines: keep ``\\n`` and ``\\t`` (a multi-line block such as a value or a
            traceback); by default they are escaped too, so one field stays on one line.
    """
    unsafe = _UNSAFE_IN_BLOCK if keep_newlines else _UNSAFE_IN_LINE
    return unsafe.sub(_visible, text)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
