"""Masking in every view and export of the console: the rules live in
:mod:`kmq_dagster.core.masking`, shared with the DLQ ingester, which masks values before it
stores them (cut at the stored limit), so that what the store keeps and what its text search
scans is masked too."""

from __future__ import annotations

from kmq_dagster.core.masking import (
    DEFAULT_MASKER,
    DEFAULT_SENSITIVE_PATTERNS,
    MASK,
    Masker,
    masker_from_env,
)

#: The default patterns (the console's older name for them).
DEFAULT_MASKED_NAMES = DEFAULT_SENSITIVE_PATTERNS

__all__ = [
    "DEFAULT_MASKED_NAMES", "DEFAULT_MASKER", "DEFAULT_SENSITIVE_PATTERNS", "MASK", "Masker",
    "masker_from_env",
]  # fmt: skip
