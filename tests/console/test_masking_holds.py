"""Masking that holds and values that always render: secret-looking names masked by pattern in
JSON fields and headers, before the stored cut, behind a BOM, in NDJSON; the store's text
search scans masked text; any value, of any shape and size, renders or shows a placeholder
(a property test over generated values)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kmq_dagster.audit.browse import page
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.models import MAX_STORED_VALUE_BYTES
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.filter_form import filter_of
from kmq_dagster.console.masking import DEFAULT_MASKER, MASK, Masker, masker_from_env
from kmq_dagster.console.rendering import (
    JSON,
    TEXT,
    export,
    header_rows,
    preview,
    view_value,
)
from kmq_dagster.core.rendering import render_bytes
from kmq_dagster.core.retry_headers import TRACEBACK
from kmq_dagster.errors import ConfigError
from tests.console.conftest import stored_row
from tests.console.test_rendering import stored

SECRET = "hunter2-zq81"
DEEP = b"[" * 499 + b"]" * 499


def shown_everywhere(raw: bytes, headers: list[list[object]] | None = None) -> str:
    """Everything a viewer can see or export of a value: views, preview, hex, JSON export."""
    view = view_value(raw, DEFAULT_MASKER)
    letter = stored(raw, headers or [])
    return "\n".join([
        view.text, view.hex, preview(raw, DEFAULT_MASKER), json.dumps(view.document),
        json.dumps(export(letter, DEFAULT_MASKER)), json.dumps(header_rows(letter, DEFAULT_MASKER)),
    ])  # fmt: skip


@pytest.mark.parametrize(
    "name",
    ["X-Auth-Token", "db_password", "aws_secret_access_key", "sessionId", "apiKey", "db_pwd",
     "privateKey", "Set-Cookie", "request_signature", "userCredentials", "Authorization"],
)  # fmt: skip
def test_secret_looking_names_are_masked_by_pattern_in_json_fields_and_headers(name: str) -> None:
    raw = json.dumps({"order": 1, "nested": [{name: SECRET}]}).encode()

    shown = shown_everywhere(raw, [[name, SECRET, False]])

    assert SECRET not in shown
    assert header_rows(stored(raw, [[name, SECRET, False]]), DEFAULT_MASKER)[0]["value"] == MASK


@pytest.mark.parametrize("name", ["order_id", "keyboard", "business_name", "amount"])
def test_ordinary_names_are_not_masked(name: str) -> None:
    assert not DEFAULT_MASKER.is_sensitive(name)
    assert view_value(json.dumps({name: "v"}).encode(), DEFAULT_MASKER).masked_fields == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"\xef\xbb\xbf" + json.dumps({"password": SECRET}).encode(),  # behind a BOM
        b'{"a": 1}\n{"token": "' + SECRET.encode() + b'"}\n',  # NDJSON
        json.dumps({"password": SECRET, "pad": "x" * 70_000}).encode()[:65_536],  # cut short
        json.dumps({"note": json.dumps({"password": SECRET})}).encode(),  # JSON in a string
        b"\xff\xfe" + json.dumps({"secret": SECRET}).encode() + b"\x00",  # not UTF-8
        b"GET /orders?id=1&access_token=" + SECRET.encode() + b" HTTP/1.1",  # a URL
        b'{"password": "' + SECRET.encode(),  # cut inside the secret
    ],
    ids=["bom", "ndjson", "cut", "quoted-json", "binary", "query-string", "cut-in-value"],
)
def test_values_that_do_not_parse_as_json_are_masked_too(raw: bytes) -> None:
    assert SECRET[:6] not in shown_everywhere(raw)


def test_json_behind_a_bom_still_shows_as_json() -> None:
    view = view_value(b"\xef\xbb\xbf" + json.dumps({"password": SECRET}).encode(), DEFAULT_MASKER)

    assert view.kind == JSON and view.document == {"password": MASK} and view.note


def test_patterns_are_configurable_by_environment() -> None:
    masker = masker_from_env({"KMQ_MASKED_FIELDS": "customer_email, phone"})

    assert masker.is_sensitive("customerEmail") and masker.is_sensitive("phone_number")
    assert masker.is_sensitive("X-Auth-Token")  # the defaults stay


def test_a_499_deep_value_renders_as_text_in_every_view_and_export() -> None:
    view = view_value(DEEP, DEFAULT_MASKER)

    assert view.kind == TEXT and "nested more than" in view.note
    assert preview(DEEP, DEFAULT_MASKER).startswith("[[[")
    exported = export(stored(DEEP, []), DEFAULT_MASKER)
    assert exported["value"] == DEEP.decode() and json.dumps(exported)


def test_the_store_keeps_values_masked_before_the_cut_and_search_cannot_probe_them(
    tmp_path: Path,
) -> None:
    value = json.dumps({"password": SECRET, "pad": "x" * 70_000}).encode()
    headers: list[tuple[str, bytes | None]] = [("X-Auth-Token", SECRET.encode()), ("t", b"a")]
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    store.add_dead_letters([stored_row(1, value=value, headers=headers)])

    [letter] = page(store, DeadLetterFilter(), after=None, size=10).rows
    probes = ['"password": "h', SECRET[:3], SECRET]

    assert letter.value_truncated and len(letter.value or b"") <= MAX_STORED_VALUE_BYTES
    assert SECRET.encode() not in (letter.value or b"")
    assert SECRET not in json.dumps(letter.headers)
    assert SECRET[:6] not in shown_everywhere(letter.value or b"", letter.headers)
    assert [store.count_dead_letters(DeadLetterFilter(search=p)) for p in probes] == [0, 0, 0]
    assert store.count_dead_letters(DeadLetterFilter(search='"pad": "xxx')) == 1


def test_error_messages_and_tracebacks_are_stored_masked(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    message = f'login to the payments API failed: {{"user": "svc", "password": "{SECRET}"}}'
    traceback = f"Traceback ...\nConnectionError: https://pay.example/?token={SECRET}"
    store.add_dead_letters([stored_row(1, message=message,
                                       headers=[(TRACEBACK, traceback.encode())])])  # fmt: skip

    [letter] = page(store, DeadLetterFilter(), after=None, size=10).rows

    assert SECRET not in letter.error_message and '"password": "****"' in letter.error_message
    assert SECRET not in json.dumps(letter.headers) and "token=****" in json.dumps(letter.headers)
    assert store.count_dead_letters(DeadLetterFilter(search=SECRET[:4])) == 0
    assert store.count_dead_letters(DeadLetterFilter(search="payments API failed")) == 1


def test_a_viewer_cannot_filter_a_masked_header_by_its_value() -> None:
    with pytest.raises(ConfigError, match="masked"):
        filter_of({"header": "X-Auth-Token=hunter2"}, 0, masker=DEFAULT_MASKER)

    assert filter_of({"header": "X-Auth-Token"}, 0, masker=DEFAULT_MASKER).header == (
        "X-Auth-Token", None,
    )  # fmt: skip


# -- any value renders: a property test ------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_documents = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=30,
)  # fmt: skip
_secret_names = st.sampled_from(["password", "X-Auth-Token", "db_password", "apiKey", "session"])


@st.composite
def _values(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A value of any shape (and whether a secret it holds must stay hidden): JSON documents
    holding a secret at some depth, maybe cut anywhere after it, behind a BOM or as NDJSON;
    deep nesting; random bytes; broken UTF-8."""
    kind = draw(st.sampled_from(["json", "deep", "bytes", "broken"]))
    if kind == "deep":
        depth = draw(st.integers(0, 2_000))
        return b"[" * depth + b"]" * draw(st.integers(0, depth)), False
    if kind == "bytes":
        return draw(st.binary(max_size=600)), False
    if kind == "broken":
        text = json.dumps(draw(_documents)).encode()
        cut = draw(st.integers(0, len(text)))
        return text[:cut] + b"\xc3\x28" + text[cut:], False
    secret = {draw(_secret_names): SECRET}
    for _ in range(draw(st.integers(0, 5))):
        secret = draw(st.sampled_from([[secret], {"n": secret}]))
    document = draw(_documents)
    raw = json.dumps([document, secret, document]).encode()
    if draw(st.booleans()):
        raw = b"\xef\xbb\xbf" + raw
    if draw(st.booleans()):
        raw = json.dumps(document).encode() + b"\n" + raw + b"\n"
    if draw(st.booleans()):
        raw = raw[: raw.index(SECRET.encode()) + draw(st.integers(0, len(SECRET) + 40))]
    return raw, True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values(), st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=3))
def test_any_value_renders_in_every_view_and_export_and_its_secrets_stay_masked(
    value: tuple[bytes, bool], headers: list[tuple[str, str]]
) -> None:
    raw, holds_secret = value

    shown = shown_everywhere(raw, [[name, text, False] for name, text in headers])

    assert len(preview(raw, DEFAULT_MASKER)) <= 120
    if holds_secret:
        assert SECRET[:6] not in shown


def test_masker_of_ignores_blank_patterns() -> None:
    assert Masker.of(["", " ", "-"]).patterns == frozenset()


def test_the_cli_rendering_masks_before_it_cuts_and_prints_deep_json_as_text() -> None:
    cut = json.dumps({"password": SECRET, "pad": "x" * 10_000}).encode()

    assert SECRET not in render_bytes(cut)[1] and "more bytes" in render_bytes(cut)[1]
    assert render_bytes(b"[" * 499 + b"]" * 499)[0] == "text"
    assert render_bytes(json.dumps({"token": SECRET}).encode()) == (
        "json",
        '{\n  "token": "****"\n}',
    )
