"""How values and headers are shown and exported: masked by name at any depth, JSON / text /
hex chosen by content, markdown escaped where it would otherwise be rendered (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from kmq_dagster.audit.models import DeadLetter
from kmq_dagster.console.masking import DEFAULT_MASKED_NAMES, MASK, Masker
from kmq_dagster.console.rendering import (
    BINARY,
    EMPTY,
    JSON,
    TEXT,
    escape_markdown,
    export,
    header_rows,
    hex_dump,
    key_text,
    preview,
    sample_rows,
    static_table,
    view_value,
)

MASKER = Masker.of([*DEFAULT_MASKED_NAMES, "customer_email"])
CARD = "4111111111111111"


def stored(value: bytes | None, headers: list[list[object]]) -> DeadLetter:
    moment = datetime(2026, 11, 23, tzinfo=UTC)
    return DeadLetter(
        id=7, dlq_topic="o.g.dlq", dlq_partition=0, dlq_offset=3, queue_topic="o", group_id="g",
        key=b"k", value=value, value_size=len(value or b""), value_truncated=False,
        headers=headers, error_type="E", error_message="m", reason="r", attempts=2,
        original_topic="o", original_partition=0, original_offset=1, first_failure_at=moment,
        last_failure_at=moment, status="new",
    )  # fmt: skip


def test_sensitive_json_fields_are_masked_at_any_depth_whatever_their_spelling() -> None:
    value = json.dumps({
        "order": 1, "card_number": CARD, "payer": {"Card-Number": CARD, "cardNumber": CARD,
        "name": "Ann"}, "lines": [{"password": "hunter2"}], "customer_email": "a@b.c",
    }).encode()  # fmt: skip

    view = view_value(value, MASKER)

    assert view.kind == JSON and view.masked_fields == 5
    assert view.document["payer"] == {"Card-Number": MASK, "cardNumber": MASK, "name": "Ann"}
    assert view.document["lines"] == [{"password": MASK}]
    for shown in (view.text, view.hex, preview(value, MASKER)):
        assert CARD not in shown and "hunter2" not in shown and "a@b.c" not in shown
    assert CARD[:8] not in view.hex.replace(" ", "")  # not even in the hex dump's ASCII column


def test_sensitive_headers_are_masked_in_views_and_exports() -> None:
    letter = stored(
        json.dumps({"card_number": CARD, "ok": True}).encode(),
        [["Authorization", "Bearer s3cr3t", False], ["trace", "abc", False],
         ["x-api-key", "a2V5", True], ["empty", None, False]],
    )  # fmt: skip

    rows = header_rows(letter, MASKER)
    exported = json.dumps(export(letter, MASKER))

    assert rows == [
        {"name": "Authorization", "value": MASK, "encoding": "utf-8"},
        {"name": "trace", "value": "abc", "encoding": "utf-8"},
        {"name": "x-api-key", "value": MASK, "encoding": "base64"},
        {"name": "empty", "value": "", "encoding": "none"},
    ]
    assert "s3cr3t" not in exported and CARD not in exported and "a2V5" not in exported
    assert json.loads(exported)["value"] == {"card_number": MASK, "ok": True}


@pytest.mark.parametrize(
    ("raw", "kind"),
    [(b'{"a": [1, 2]}', JSON), (b"plain <b>text</b>", TEXT), (b"\x00\xff\x10", BINARY),
     (b"", EMPTY), (None, EMPTY), (b"[1, 2", TEXT)],
)  # fmt: skip
def test_a_value_is_shown_as_json_text_or_binary_by_its_content(
    raw: bytes | None, kind: str
) -> None:
    assert view_value(raw, MASKER).kind == kind


def test_binary_values_and_keys_show_as_hex_and_control_characters_never_reach_a_cell() -> None:
    raw = bytes(range(20)) + b"AB"

    assert hex_dump(raw).splitlines()[0] == (
        "00000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  |................|"
    )
    assert hex_dump(raw).splitlines()[1].endswith("|....AB|")
    assert preview(raw, MASKER).startswith("0x000102")
    assert "\n" not in preview(b"line one\nline two\x1b[31m", MASKER)
    assert key_text(b"\xff\x00") == "0xff00" and key_text(b"order-1") == "order-1"
    assert len(preview(b"x" * 500, MASKER)) == 120


def test_markdown_and_html_in_data_are_escaped_for_the_places_that_render_markdown() -> None:
    escaped = escape_markdown("**bold** <img src=x onerror=alert(1)> [a](http://x) $x$ :smile:")

    assert "**" not in escaped.replace("\\*", "")
    assert escaped.startswith("\\*\\*bold\\*\\* \\<img src\\=x")
    assert "\\[a\\]\\(http\\://x\\)" in escaped
    assert "\\$x\\$" in escaped and "\\:smile\\:" in escaped


def test_a_dry_run_sample_shows_keys_as_the_dead_letters_page_does() -> None:
    lines = ["orders.billing.dlq[0]@12 key=b'4' TimeoutError",
             "orders.billing.dlq[1]@3 key=b'\\xff\\x00' KeyError",
             "orders.billing.dlq[1]@4 key=None ValueError", "a line of another shape"]  # fmt: skip
    assert sample_rows(lines) == [
        {"DLQ position": "orders.billing.dlq[0]@12", "key": "4", "error type": "TimeoutError"},
        {"DLQ position": "orders.billing.dlq[1]@3", "key": "0xff00", "error type": "KeyError"},
        {"DLQ position": "orders.billing.dlq[1]@4", "key": "", "error type": "ValueError"},
        {"DLQ position": "a line of another shape", "key": "", "error type": ""},
    ]


def test_a_static_table_shows_dashes_arrows_and_markup_as_written() -> None:
    frame = static_table([{"a": "-", "b": "closed -> open **now**", "n": 3}])
    assert frame.to_dict("records") == [
        {"a": "\\-", "b": "closed \\-\\> open \\*\\*now\\*\\*", "n": 3}]  # fmt: skip
