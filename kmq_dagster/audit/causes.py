"""What "the same cause" means: an error message with its variable parts replaced (pure).

Dead letters that failed for one reason rarely carry the same message: order ids, amounts,
timestamps and hosts differ. The console groups dead letters by error type and this pattern,
so ``order 1234 not found`` and ``order 98 not found`` count as one cause,
``order <n> not found``. Words are kept: ``KeyError: 'customer_id'`` and ``KeyError: 'amount'``
stay two causes.
"""

from __future__ import annotations

import re

from kmq_dagster.core.retry_headers import truncate_utf8

#: Longest pattern stored, in UTF-8 bytes: it is part of an index, and PostgreSQL refuses
#: index entries over about 2,700 bytes.
MAX_PATTERN_BYTES = 400

#: Replacements, applied in order; earlier ones protect their matches from later ones.
_REPLACEMENTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
     "<uuid>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?"),
     "<time>"),
    (re.compile(r"\b[\w.+-]+@[\w-]+(\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b"), "<ip>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    # Hex ids: a long run of hex digits that has at least one digit (so words stay words).
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}\b"), "<hex>"),
    (re.compile(r"(?<!\w)[-+]?\d+([.,]\d+)*([eE][-+]?\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)  # fmt: skip


def error_pattern(message: str) -> str:
    """``message`` with ids, numbers, times, addresses and hex values replaced by placeholders.

    >>> error_pattern("order 1234 not found (took 0.53 s)")
    'order <n> not found (took <n> s)'
    >>> error_pattern("user 7f3e2a1b-0c4d-4e5f-8a9b-112233445566 at 10.0.0.7:5432 refused")
    'user <uuid> at <ip> refused'
    """
    pattern = message
    for regex, placeholder in _REPLACEMENTS:
        pattern = regex.sub(placeholder, pattern)
    return truncate_utf8(pattern.strip(), MAX_PATTERN_BYTES)
