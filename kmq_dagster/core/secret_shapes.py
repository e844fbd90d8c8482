"""Secrets in text that is not JSON: the shapes an exception's message and stack text take
(pure, stdlib only).

:class:`~kmq_dagster.core.masking.Masker` masks ``"name": value`` pairs of JSON itself; this
module finds the rest, so that error text is masked like values (invariant 13):

* a sensitive name, bare or quoted (``'`` or ``"``, escaped with any number of backslashes, its
  letters maybe spelled ``\\u0077``), then ``:``, ``=`` or ``=>``, then its value: Python reprs
  (``{'password': 'x'}``), YAML (``password: x``), HTTP headers (``Authorization: Basic x``),
  ``key=value`` in query strings and log lines, keyword arguments, escaped JSON
  (``{\\"password\\": \\"x\\"}``), names after a ``\\n`` escape;
* ``<password>x</password>`` elements;
* credentials of a URL (``https://bob:PW@host``);
* the credentials after an HTTP auth scheme (``Bearer eyJ...``), JSON web tokens anywhere;
* card numbers (13-19 digits, spaces or dashes between, with a card network's first digits and
  a valid Luhn check digit).

A bare value after ``:`` or ``=>`` runs to the end of its line (or a ``,``, ``;``, ``}`` or
``]``): YAML and HTTP header values hold spaces. A bare value after ``=`` is one token
(``a=1&token=x&b=2``). What is not found: a secret with no name, network or shape beside it
(``failed for hunter2``), and names outside the patterns.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: The text every masked value is replaced with (the same as :data:`masking.MASK`).
MASK = "****"

#: An escaped character inside a name: ``\\u0077``, ``\\x77`` (any number of backslashes).
_ESCAPE = r"\\+(?:u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2})"
_NAME = rf"(?:[A-Za-z_]|{_ESCAPE})(?:[\w.\-]|{_ESCAPE}){{0,99}}"
#: A name starts where no name character (or a backslash) stands before it, or right after a
#: ``\\n``, ``\\r`` or ``\\t`` escape (a repr's line break).
_NAME_START = r"(?=[A-Za-z_'\"\\])(?:(?<![\w.\-\\])|(?<=\\[nrt]))"
_PAIR = re.compile(
    _NAME_START
    + r"(?P<open>\\*(?P<quote>['\"]))?"
    + rf"(?P<name>{_NAME})"
    + r"(?(open)\\*(?P=quote))"
    + r"(?P<sep>[ \t]*(?:(?P<colon>=>|:)|=)[ \t]*)"
    + r"(?P<value>"
    + r"(?P<vopen>\\*(?P<vquote>['\"]))(?P<body>.*?)(?:(?P=vopen)|$)"  # a quoted value
    # a bare value: the rest of the line after ":" or "=>", one token after "="
    + r"|(?P<bare>(?:(?!\\[nrt])[^\s,;&}\]<>'\"\\])"
    + r"(?(colon)(?:(?!\\[nrt])[^\r\n,;&}\]<>'\"])*|(?:(?!\\[nrt])[^\s&;,\"'<>])*))"
    + r")",
    re.MULTILINE,
)
_ELEMENT = re.compile(
    r"<(?P<tag>[A-Za-z_][\w.:\-]{0,99})(?:\s[^<>]*)?>(?P<body>[^<]*)</(?P=tag)\s*>"
)
_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[A-Za-z][\w+.\-]{0,30}://)(?P<user>[^\s:/@'\"]*):(?P<password>[^\s/@'\"]+)@"
)
_AUTH_SCHEME = re.compile(
    r"\b(?P<scheme>Basic|Bearer|Digest|Negotiate|Token|ApiKey)[ \t]+"
    r"(?P<credentials>[A-Za-z0-9._~+/=\-]{8,})",
    re.IGNORECASE,
)
_JWT = re.compile(r"\beyJ[\w-]{4,}\.eyJ[\w-]{4,}\.[\w-]*")
#: 13 to 19 digits with single spaces or dashes between them.
_CARD = re.compile(r"(?<![\d\w])\d(?:[ \-]?\d){12,18}(?![\d\w])")
#: Where a card number may stand (found at C speed; :data:`_CARD` then looks inside).
_CARD_SPAN = re.compile(r"\d[\d \-]{11,}\d")
#: A name token, or a little more (to skip :data:`_PAIR`'s scan where no name is sensitive).
_NAME_TOKEN = re.compile(r"[A-Za-z_\\][\w.\-\\]*")
#: The auth schemes of :data:`_AUTH_SCHEME`, lower case.
_SCHEMES = ("basic", "bearer", "digest", "negotiate", "token", "apikey")
#: First digits of the card networks (Visa, Mastercard, Amex, Diners, JCB, Discover, UnionPay,
#: Maestro): millisecond timestamps (``17...``) and most ids do not start so.
_CARD_NETWORK = re.compile(r"4|5[0-8]|2[2-7]|3[0478]|35|6")
#: An exception class's name (``KeyError: 'order_id'``) is never a secret's name.
_EXCEPTION_NAME = re.compile(r"(?:Error|Exception|Warning)$")
#: Whether a text may hold a shape found without a name (a cheap test before the scans).
_NAMELESS_HINT = re.compile(r"://|\d{4}|eyJ|Basic|Bearer|Digest|Negotiate|Token|ApiKey", re.I)

IsSensitive = Callable[[str], bool]


def mask_shapes(text: str, is_sensitive: IsSensitive, may_name: bool) -> tuple[str, int]:
    """``text`` with every secret of the module's shapes masked, and how many were.

    Args:
        is_sensitive: whether a (decoded) name is a secret's name.
        may_name: whether a sensitive name may occur in ``text`` at all (``False`` skips the
            scans that need one).
    """
    count = 0
    if (may_name or "\\" in text) and _names_a_secret(text, is_sensitive):
        text, found = _mask_pairs(text, is_sensitive)
        count += found
        if "<" in text:
            text, found = _mask_elements(text, is_sensitive)
            count += found
    if _NAMELESS_HINT.search(text):
        for scan in (_mask_url_credentials, _mask_auth_schemes, _mask_jwts, _mask_cards):
            text, found = scan(text)
            count += found
    return text, count


def _names_a_secret(text: str, is_sensitive: IsSensitive) -> bool:
    """Whether a name token in ``text`` is sensitive (``is_sensitive`` is cached per name)."""
    return any(is_sensitive(decoded_name(t)) for t in set(_NAME_TOKEN.findall(text)))


def decoded_name(name: str) -> str:
    """``name`` with its ``\\u0077``/``\\x77`` escapes (any number of backslashes) decoded."""
    if "\\" not in name:
        return name
    return re.sub(_ESCAPE, lambda m: chr(int(m.group(0).lstrip("\\")[1:], 16)), name)


def _mask_pairs(text: str, is_sensitive: IsSensitive) -> tuple[str, int]:
    """Every sensitive name's value masked. Only where a name token is sensitive is a pair
    looked for (a scan of :data:`_PAIR` over every position costs ~0.4 us a character)."""
    out: list[str] = []
    found = copied = 0
    for token in _NAME_TOKEN.finditer(text):
        if token.start() < copied or not is_sensitive(decoded_name(token.group(0))):
            continue
        match = _pair_at(text, token.start(), copied)
        if match is None:
            continue
        if match.group("vopen") is not None:
            start, end = match.span("body")
        else:
            start = match.start("bare")
            end = start + len(match.group("bare").rstrip())
        name = decoded_name(match.group("name"))
        if text[start:end] in ("", MASK) or _EXCEPTION_NAME.search(name) or not is_sensitive(name):
            continue
        out += [text[copied:start], MASK]
        found += 1
        copied = max(end, match.end("name") + 1)
    out.append(text[copied:])
    return "".join(out), found


def _pair_at(text: str, at: int, floor: int) -> re.Match[str] | None:
    """The pair whose name is the token at ``at``: opened by the quotes and backslashes before
    it, or starting after a ``\\n`` escape the token begins with."""
    opening = at
    while opening > floor and text[opening - 1] in "'\"\\":
        opening -= 1
    after_escape = (at + 2,) if text.startswith(("\\n", "\\r", "\\t"), at) else ()
    for start in dict.fromkeys((opening, at, *after_escape)):
        match = _PAIR.match(text, start)
        if match is not None:
            return match
    return None


def _mask_elements(text: str, is_sensitive: IsSensitive) -> tuple[str, int]:
    def secret_element(element: re.Match[str]) -> bool:
        tag = element.group("tag").rpartition(":")[2]  # a namespace prefix is not the name
        return bool(element.group("body").strip()) and is_sensitive(tag)

    return _replace_group(_ELEMENT, "body", text, secret_element)


def _replace_group(
    pattern: re.Pattern[str],
    group: str | int,
    text: str,
    keep: Callable[[re.Match[str]], bool] = lambda _match: True,
) -> tuple[str, int]:
    """``text`` with ``group`` of each match of ``pattern`` masked where ``keep(match)``."""
    found = 0

    def masked(match: re.Match[str]) -> str:
        nonlocal found
        if match.group(group) == MASK or not keep(match):
            return match.group(0)
        found += 1
        at = match.start()
        start, end = match.span(group)
        return match.group(0)[: start - at] + MASK + match.group(0)[end - at :]

    return pattern.sub(masked, text), found


def _mask_url_credentials(text: str) -> tuple[str, int]:
    return _replace_group(_URL_CREDENTIALS, "password", text) if "://" in text else (text, 0)


def _mask_auth_schemes(text: str) -> tuple[str, int]:
    lower = text.lower()
    if not any(scheme in lower for scheme in _SCHEMES):
        return text, 0
    return _replace_group(_AUTH_SCHEME, "credentials", text)


def _mask_jwts(text: str) -> tuple[str, int]:
    return _replace_group(_JWT, 0, text) if "eyJ" in text else (text, 0)


def _mask_cards(text: str) -> tuple[str, int]:
    found = 0

    def inside(span: re.Match[str]) -> str:
        nonlocal found
        masked, count = _replace_group(_CARD, 0, span.group(0), _card_match)
        found += count
        return masked

    return _CARD_SPAN.sub(inside, text), found


def _card_match(match: re.Match[str]) -> bool:
    return is_card_number(match.group(0))


def is_card_number(text: str) -> bool:
    """Whether ``text`` (digits, maybe spaced or dashed) reads as a payment card number: 13 to
    19 digits, a card network's first digits and a valid Luhn check digit.

    Examples:
        >>> is_card_number("4111 1111 1111 1111"), is_card_number("4111 1111 1111 1112")
        (True, False)
    """
    digits = [int(c) for c in text if c.isdigit()]
    if not 13 <= len(digits) <= 19 or not _CARD_NETWORK.match("".join(map(str, digits[:2]))):
        return False
    doubled = [d * 2 - 9 if d > 4 else d * 2 for d in reversed(digits[-2::-2])]
    return (sum(digits[-1::-2]) + sum(doubled)) % 10 == 0
