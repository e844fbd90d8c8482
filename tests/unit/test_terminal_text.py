"""Message data printed to a terminal shows its control characters instead of obeying them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.terminal_text import escape_control

HOSTILE = [
    ("\x1b]52;c;aGVsbG8=\x07", "\\x1b]52;c;aGVsbG8=\\x07"),  # OSC 52: write the clipboard
    ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear the screen, cursor home
    ("paid\rrefunded", "paid\\x0drefunded"),  # carriage return overwrites the line
    ("ok\x08\x08no", "ok\\x08\\x08no"),  # backspaces
    ("\x9b2J", "\\x9b2J"),  # C1 CSI: a screen clear on terminals that read C1
    ("abc\u202eexe.pdf", "abc\\u202eexe.pdf"),  # right-to-left override
    ("\x7f\x00", "\\x7f\\x00"),
    ("bad \udcff byte", "bad \\udcff byte"),  # an undecodable byte Python kept
    ("pay\u200bpal", "pay\\u200bpal"),  # a zero width space: two names that look alike
    ("\ufeffid\u2060x", "\\ufeffid\\u2060x"),  # byte-order mark, word joiner
]


@pytest.mark.parametrize(("text", "shown"), HOSTILE)
def test_control_sequences_are_shown_not_obeyed(text: str, shown: str) -> None:
    assert escape_control(text) == shown


def test_a_field_stays_on_one_line_and_a_block_keeps_its_lines() -> None:
    assert escape_control("a\nb\tc") == "a\\x0ab\\x09c"
    assert escape_control("a\nb\tc\x1b", keep_newlines=True) == "a\nb\tc\\x1b"


def test_ordinary_text_is_unchanged() -> None:
    text = 'order {"id": 7, "name": "Zoë", "note": "→ 東京 👩\u200d💻"} \\x1b stays as typed'
    assert escape_control(text) == text


@given(st.text())
def test_no_escaped_text_holds_a_character_a_terminal_obeys(text: str) -> None:
    escaped = escape_control(text)

    assert not any(
        ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F or 0xD800 <= ord(char) <= 0xDFFF
        for char in escaped
    ), repr(escaped)
