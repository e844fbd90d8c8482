"""Masking of secret-looking names in header values and in message text (pure, stdlib only).

A name is sensitive when it *looks like* a secret's name, matched by pattern rather than by a
fixed list: ``X-Auth-Token``, ``db_password``, ``aws_secret_access_key`` and ``sessionId`` are
all caught by the default patterns. Names are compared case- and separator-insensitively (see
:meth:`Masker.is_sensitive` for the exact rule).

Values are masked as *text*, by a scanner that never parses a document into a tree and never
recurses per nesting level, so it holds for any input: JSON at any depth, JSON cut at the stored
limit, JSON behind a byte-order mark, NDJSON, JSON quoted inside a JSON string, JSON inside a
log line, ``token=...`` in a URL, Python reprs, YAML, XML, HTTP auth headers, URL
credentials and card numbers (:mod:`~kmq_dagster.core.secret_shapes`), and bytes that are not
UTF-8 at all (masked through ``surrogateescape``, so the bytes around a secret are kept exactly).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kmq_dagster.core.secret_shapes import mask_shapes

#: What a masked value shows (a JSON string, so masked JSON still parses).
MASK = "****"
#: Name patterns masked unless configured otherwise; ``KMQ_MASKED_FIELDS`` adds more.
DEFAULT_SENSITIVE_PATTERNS = (
    "token", "secret", "password", "passwd", "pwd", "key", "auth", "credential", "session",
    "cookie", "signature", "private", "card_number", "cvv", "cvc", "iban", "ssn",
    "passphrase", "pw", "jwt", "otp", "pin", "csrf", "xsrf",
)  # fmt: skip
#: Extra name patterns, comma-separated (read by the console and the DLQ ingester alike).
MASKED_FIELDS_ENV = "KMQ_MASKED_FIELDS"
#: The console's older name for the same setting, still honoured.
CONSOLE_MASKED_FIELDS_ENV = "KMQ_CONSOLE_MASKED_FIELDS"
#: Patterns shorter than this match a whole word (or the end of the name), not any substring:
#: ``key`` masks ``api_key`` and ``apikey`` but not ``keyboard``; ``ssn`` not ``business_name``.
SHORT_PATTERN_CHARS = 4
#: How far past a cut masking reads: a secret's value starts after its name, so the part kept
#: is masked exactly as masking the whole (maybe huge) value would mask it.
MASKING_LOOKAHEAD_BYTES = 4_096
#: How many levels of JSON quoted inside JSON strings are unquoted and masked.
MAX_QUOTED_DEPTH = 3

_SEPARATORS = re.compile(r"[^0-9a-z]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: A complete string, and the colon after it when it is an object's name.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"(?P<colon>[ \t\r\n]*:)?', re.DOTALL)
_SPACE = re.compile(r"[ \t\r\n]*")
_SCALAR = re.compile(r'[^,}\]\s"]*')


def _words(name: str) -> list[str]:
    return [word for word in _SEPARATORS.split(_CAMEL.sub(" ", name).lower()) if word]


@dataclass(frozen=True)
class Masker:
    """Which names are sensitive, and the masking of header values and texts by them."""

    patterns: frozenset[str]

    def __post_init__(self) -> None:
        # Field names repeat from message to message: decide each name once.
        cached = functools.lru_cache(maxsize=4_096)(self._looks_secret)
        object.__setattr__(self, "_cached_is_sensitive", cached)

    @classmethod
    def of(cls, patterns: Iterable[str]) -> Masker:
        return cls(frozenset("".join(_words(p)) for p in patterns if "".join(_words(p))))

    def is_sensitive(self, name: str) -> bool:
        """Whether ``name`` looks like a secret's name: a pattern of 4 or more characters
        occurs anywhere in it (``XAuthToken`` has ``auth`` and ``token``), a shorter one is one
        of its words or ends it (``api-key``, ``apikey``, ``db_pwd``)."""
        return bool(self._cached_is_sensitive(name))  # type: ignore[attr-defined]

    def _looks_secret(self, name: str) -> bool:
        words = _words(name)
        joined = "".join(words)
        for pattern in self.patterns:
            if len(pattern) >= SHORT_PATTERN_CHARS:
                if pattern in joined:
                    return True
            elif pattern in words or joined.endswith(pattern):
                return True
        return False

    def header_value(self, name: str, value: str | None) -> str | None:
        """``value`` masked: all of it under a sensitive name, else the secrets inside it
        (a header without a value stays without one)."""
        if value is None:
            return None
        return MASK if self.is_sensitive(name) else self.mask_text(value)[0]

    def mask_text(self, text: str) -> tuple[str, int]:
        """``text`` with every secret it holds masked, and how many were: the value of every
        sensitive ``"name": value`` pair of JSON, and the shapes of
        :mod:`~kmq_dagster.core.secret_shapes` (reprs, YAML, XML, ``name=value``, HTTP auth,
        URL credentials, tokens, card numbers): error text is masked like values."""
        may_name = "\\" in text or self._may_name_a_secret(text)
        count = 0
        if may_name:
            text, count = self._json_pairs(text, 0)
        text, more = mask_shapes(text, self.is_sensitive, may_name)
        return text, count + more

    def mask_bytes(self, raw: bytes) -> tuple[bytes, int]:
        """``raw`` masked like :meth:`mask_text`; bytes that are not UTF-8 are kept as they were."""
        masked, count = self.mask_text(raw.decode("utf-8", errors="surrogateescape"))
        return (masked.encode("utf-8", errors="surrogateescape"), count) if count else (raw, 0)

    def _may_name_a_secret(self, text: str) -> bool:
        """Whether a pattern occurs in ``text`` squeezed like a name (lower case, letters and
        digits only). A sensitive name's squeezed form holds its pattern, and a name is a
        contiguous part of the text, so ``False`` proves no name in it is sensitive (a name
        spelled with escapes is not squeezed the same way: the caller checks for backslashes)."""
        squeezed = _SEPARATORS.sub("", text.lower())
        return any(pattern in squeezed for pattern in self.patterns)

    def cut(self, raw: bytes, max_bytes: int) -> bytes:
        """The first ``max_bytes`` of ``raw`` *masked before the cut*: a JSON value cut short
        no longer parses, and its secrets must not be kept or shown in clear."""
        return self.mask_bytes(raw[: max_bytes + MASKING_LOOKAHEAD_BYTES])[0][:max_bytes]

    def _json_pairs(self, text: str, depth: int) -> tuple[str, int]:
        """Every quoted name followed by ``:`` whose name is sensitive gets its value (a string,
        a scalar, or a whole object or array, to its end or the end of the text) replaced.

        The scan jumps from one complete string to the next (a string cut short ends the
        text, and nothing after it can be a name)."""
        out: list[str] = []
        count = copied = scan = 0
        search = _TOKEN.search
        while (found := search(text, scan)) is not None:
            start, end = found.span()
            is_name = found.group("colon") is not None
            token = text[start : found.start("colon")] if is_name else text[start:end]
            if is_name and self.is_sensitive(_unquoted(token)):
                value_start = _SPACE.match(text, end).end()  # type: ignore[union-attr]
                out += [text[copied:value_start], f'"{MASK}"']
                count += 1
                copied = scan = _value_end(text, value_start)
                continue
            if not is_name and "\\" in token:
                shown, inner = self._quoted(token, depth)
                if inner:
                    out += [text[copied:start], shown]
                    count += inner
                    copied = end
            scan = end
        out.append(text[copied:])
        return "".join(out), count

    def _quoted(self, token: str, depth: int) -> tuple[str, int]:
        """A JSON string holding JSON (``"{\\"password\\": ...}"``), its inside masked."""
        if depth >= MAX_QUOTED_DEPTH:
            return token, 0
        try:
            inner = json.loads(token)
        except ValueError:
            return token, 0
        if not isinstance(inner, str):
            return token, 0
        masked, count = self._json_pairs(inner, depth + 1)
        return (json.dumps(masked, ensure_ascii=False), count) if count else (token, 0)


def _unquoted(token: str) -> str:
    if "\\" not in token:
        return token[1:-1]
    try:
        name = json.loads(token)
    except ValueError:
        return token.strip('"')
    return name if isinstance(name, str) else token


def _value_end(text: str, start: int) -> int:
    """Where the JSON value starting at ``start`` ends (the end of the text if it is cut)."""
    if start >= len(text):
        return start
    opener = text[start]
    if opener == '"':
        found = _STRING.match(text, start)
        return found.end() if found else len(text)
    if opener not in "[{":
        return _SCALAR.match(text, start).end()  # type: ignore[union-attr]
    depth, position = 0, start
    while position < len(text):
        char = text[position]
        if char == '"':
            found = _STRING.match(text, position)
            position = found.end() if found else len(text)
            continue
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1
    return len(text)


#: The default patterns, nothing added.
DEFAULT_MASKER = Masker.of(DEFAULT_SENSITIVE_PATTERNS)


def masker_from_env(environ: Mapping[str, str]) -> Masker:
    """The default patterns plus those ``KMQ_MASKED_FIELDS`` (or the console's older
    ``KMQ_CONSOLE_MASKED_FIELDS``) adds, comma-separated."""
    extra = ",".join(
        environ.get(name, "") for name in (MASKED_FIELDS_ENV, CONSOLE_MASKED_FIELDS_ENV)
    )
    return _masker_with(extra)


@functools.lru_cache(maxsize=8)
def _masker_with(extra: str) -> Masker:
    return Masker.of([*DEFAULT_SENSITIVE_PATTERNS, *extra.split(",")])
