"""Error text is data (invariant 13): a secret an exception's message or stack text carries, in
any of the shapes handlers write (JSON, Python reprs with escapes, YAML, XML, ``name=value``,
HTTP auth headers, URL credentials, card numbers), reaches neither the audit store, nor a page
or an export of the console, nor a viewer's search; nor does one a message's value carries in
the same shapes.

Property tests generate the texts and values; ``kmq dlq show`` (which reads the DLQ topic itself) is
checked in tests/integration/test_dlq_cli.py over the same shapes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kmq_dagster.audit.browse import page
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.masking import DEFAULT_MASKER
from kmq_dagster.console.rendering import export, header_rows, row_preview, view_value
from kmq_dagster.core.masking import masker_from_env
from kmq_dagster.core.retry_headers import TRACEBACK
from kmq_dagster.core.secret_shapes import is_card_number
from tests.console.conftest import stored_row

#: Names a secret sits under in the generated texts (the issue's leaks, and the old ones).
SECRET_NAMES = ("password", "passphrase", "pw", "jwt", "otp", "pin", "X-CSRF", "card_number",
                "api_key", "db_password", "Authorization", "client_secret",
                "sessionId")  # fmt: skip


def _escape_one_letter(name: str) -> str:
    """``password`` -> ``pass\\u0077ord``: a name spelled with a JSON/Python escape."""
    index = len(name) // 2
    return f"{name[:index]}\\u{ord(name[index]):04x}{name[index + 1 :]}"


#: Each shape puts ``secret`` under ``name`` as a handler's exception text would.
SHAPES: dict[str, Callable[[str, str], str]] = {
    "json": lambda name, secret: json.dumps({"order": 7, name: secret}),
    "python-dict": lambda name, secret: repr({"order": 7, name: secret, "amount": 3.5}),
    "python-kwargs": lambda name, secret: f"Order(id=7, {name}={secret!r})",
    "repr-with-newlines": lambda name, secret: repr(f"order 7\n{name}: {secret}\nretry later"),
    "repr-of-json": lambda name, secret: repr(json.dumps({name: secret})),
    "json-in-a-string": lambda name, secret: json.dumps({"body": json.dumps({name: secret})}),
    "escaped-quotes": lambda name, secret: f'{{\\"{name}\\": \\"{secret}\\"}}',
    "unicode-escape": lambda name, secret: f'{{"{_escape_one_letter(name)}": "{secret}"}}',
    "repr-unicode-escape":
        lambda name, secret: repr(f'{{"{_escape_one_letter(name)}": "{secret}"}}'),
    "yaml": lambda name, secret: f"config:\n  {name}: {secret}\n  retries: 3",
    "xml": lambda name, secret: f"<order id='7'><{name}>{secret}</{name}></order>",
    "key-value": lambda name, secret: f"GET /pay?id=7&{name}={secret}&v=2 HTTP/1.1",
    "http-basic": lambda _name, secret: f"Authorization: Basic {secret}",
    "bearer": lambda _name, secret: f"sent header Bearer {secret} to upstream",
    "url-credentials": lambda _name, secret: f"cannot reach https://bob:{secret}@pay.example/v1",
}  # fmt: skip

_secrets = st.text(alphabet="abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789",
                   min_size=10, max_size=24).map(lambda s: "Zq" + s)  # fmt: skip
_noise = st.text(alphabet="abcdefghijklmnopqrstuvwxyz 0123456789.,()-", max_size=40)


def _luhn_completed(digits: str) -> str:
    """``digits`` with the check digit that makes them a valid card number."""
    for check in "0123456789":
        if is_card_number(digits + check):
            return digits + check
    raise AssertionError(digits)


_cards = st.tuples(st.sampled_from(["4", "51", "37", "6011"]), st.integers(10**10, 10**11)).map(
    lambda parts: _luhn_completed((parts[0] + str(parts[1]))[:15])
)


@st.composite
def _error_texts(draw: st.DrawFn) -> tuple[str, str]:
    """``(exception text, the secret it holds)``, the secret in one of the shapes, amid noise."""
    shape = draw(st.sampled_from([*SHAPES, "card"]))
    if shape == "card":
        secret = draw(_cards)
        spaced = draw(st.booleans())
        shown = " ".join(secret[i : i + 4] for i in range(0, 16, 4)) if spaced else secret
        body = f"card {shown} declined"
    else:
        secret = draw(_secrets)
        body = SHAPES[shape](draw(st.sampled_from(SECRET_NAMES)), secret)
    return f"{draw(_noise)} order rejected: {body} {draw(_noise)}", secret


def _traceback(message: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "handlers.py", line 12, in price\n'
        '    raise ValueError(f"order rejected: {json.loads(m.value)}")\n'
        f"ValueError: {message}"
    )


def test_every_shape_of_the_issue_is_masked_with_its_secret_gone() -> None:
    # given each shape with each name: the handler's message and its traceback
    for shape, make in SHAPES.items():
        for name in SECRET_NAMES:
            text = make(name, "Zq-DictLeakPw99")
            # when masked, then the secret is gone and the text around it stays
            masked, found = DEFAULT_MASKER.mask_text(_traceback(text))
            assert "DictLeakPw99" not in masked and found >= 1, (shape, name, masked)
            assert "ValueError: " in masked and "handlers.py" in masked


@pytest.mark.parametrize(
    "text",
    ["KeyError: 'order_id'", "order 1764216000000 failed at 2026-11-27T04:06:38Z",
     "timed out after 30 s; spin: 3 left", "keyboard layout: us", "offset 4111 of 12000"],
)  # fmt: skip
def test_ordinary_error_text_keeps_what_an_operator_needs(text: str) -> None:
    masked, _ = DEFAULT_MASKER.mask_text(text)

    assert masked.split(":", maxsplit=1)[0] == text.split(":", maxsplit=1)[0]
    assert ("order_id" in masked) == ("order_id" in text)
    assert ("1764216000000" in masked) == ("1764216000000" in text)
    assert ("4111" in masked) == ("4111" in text)


def test_names_added_by_environment_mask_error_text_too() -> None:
    masker = masker_from_env({"KMQ_MASKED_FIELDS": "tax_number"})

    masked, _ = masker.mask_text("rejected: {'tax_number': 'Zq-TaxNo-998877'}")

    assert "Zq-TaxNo-998877" not in masked


#: The property tests store each example in one module-wide store (a fixture hypothesis must
#: not reset between examples).
STORED_EXAMPLES = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> AuditStore:
    path: Path = tmp_path_factory.mktemp("error-text") / "audit.db"
    return AuditStore(f"sqlite:///{path}")


@pytest.fixture(scope="module")
def offsets() -> Iterator[int]:
    return count(1)


@STORED_EXAMPLES
@given(_error_texts())
def test_no_secret_in_error_text_reaches_the_store_a_page_an_export_or_a_search(
    store: AuditStore, offsets: Iterator[int], error: tuple[str, str]
) -> None:
    message, secret = error
    offset = next(offsets)
    # given a dead letter whose exception message and traceback hold the secret
    traceback: list[tuple[str, bytes | None]] = [(TRACEBACK, _traceback(message).encode())]
    store.add_dead_letters([stored_row(offset, message=message, headers=traceback)])

    # when it is read back as the console's pages and exports read it
    [letter] = page(store, DeadLetterFilter(key=f"k{offset}".encode()), after=None, size=5).rows
    shown = "\n".join([
        letter.error_message, json.dumps(letter.headers),
        json.dumps(export(letter, DEFAULT_MASKER)), json.dumps(header_rows(letter, DEFAULT_MASKER)),
    ])  # fmt: skip

    # then the secret is nowhere, and a viewer's search cannot find the dead letter by it
    assert secret not in shown
    assert store.count_dead_letters(DeadLetterFilter(search=secret)) == 0
    assert store.count_dead_letters(DeadLetterFilter(text=secret)) == 0
    assert "order rejected" in letter.error_message


@STORED_EXAMPLES
@given(_error_texts())
def test_no_secret_a_value_carries_in_any_shape_reaches_a_page_an_export_or_a_search(
    store: AuditStore, offsets: Iterator[int], carried: tuple[str, str]
) -> None:
    text, secret = carried
    offset = next(offsets)
    # given a dead letter whose value (not JSON in most shapes) holds the secret
    store.add_dead_letters([stored_row(offset, value=text.encode())])

    # when it is read back as the console's list, detail and exports read it
    [letter] = page(store, DeadLetterFilter(key=f"k{offset}".encode()), after=None, size=5).rows
    shown = "\n".join([
        row_preview(letter, DEFAULT_MASKER), view_value(letter.value, DEFAULT_MASKER).text,
        json.dumps(export(letter, DEFAULT_MASKER)),
    ])  # fmt: skip

    # then the secret is nowhere, and "Text in value" cannot find the dead letter by it
    assert secret not in shown, shown
    assert store.count_dead_letters(DeadLetterFilter(text=secret)) == 0
    assert store.count_dead_letters(DeadLetterFilter(search=secret)) == 0
    assert "order rejected" in shown
