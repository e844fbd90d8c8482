"""Masking of sensitive header values and JSON fields in every view and export (pure).

Names match whatever their case and separators: ``card_number`` masks ``Card-Number`` and
``cardNumber`` as well. A masked JSON field keeps its key and loses its value, at any depth.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: What a masked value shows.
MASK = "****"
#: Masked unless configured otherwise (``KMQ_CONSOLE_MASKED_FIELDS`` adds more).
DEFAULT_MASKED_NAMES = (
    "authorization", "proxy-authorization", "cookie", "set-cookie", "password", "passwd",
    "secret", "client_secret", "token", "access_token", "refresh_token", "api_key", "apikey",
    "x-api-key", "card_number", "cvv", "cvc", "iban", "ssn",
)  # fmt: skip

_SEPARATORS = re.compile(r"[-_.\s]")


def _normalized(name: str) -> str:
    return _SEPARATORS.sub("", name).casefold()


@dataclass(frozen=True)
class Masker:
    """Which header and JSON field names are sensitive."""

    names: frozenset[str]

    @classmethod
    def of(cls, names: Iterable[str]) -> Masker:
        return cls(frozenset(_normalized(name) for name in names if name.strip()))

    def is_sensitive(self, name: str) -> bool:
        return _normalized(name) in self.names

    def header_value(self, name: str, value: str | None) -> str | None:
        """``value`` or the mask (a header without a value stays without one)."""
        return MASK if value is not None and self.is_sensitive(name) else value

    def json(self, document: Any) -> tuple[Any, int]:
        """``document`` with every sensitive field's value masked, and how many were."""
        if isinstance(document, dict):
            masked: dict[str, Any] = {}
            count = 0
            for key, value in document.items():
                if self.is_sensitive(str(key)):
                    masked[key], count = MASK, count + 1
                else:
                    masked[key], inner = self.json(value)
                    count += inner
            return masked, count
        if isinstance(document, list):
            items = [self.json(item) for item in document]
            return [item for item, _ in items], sum(count for _, count in items)
        return document, 0
