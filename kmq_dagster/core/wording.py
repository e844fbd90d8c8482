"""Counts and articles in what kmq prints: "1 dead letter", "2 dead letters", "an admin".

Examples:
    >>> counted(1, "dead letter"), counted(3, "copy", "copies"), counted(0, "message")
    ('1 dead letter', '3 copies', '0 messages')
    >>> f"{article('admin')} admin", f"{article('viewer')} viewer"
    ('an admin', 'a viewer')
"""

from __future__ import annotations


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """``count`` and the noun in the number it takes (English: singular for exactly one)."""
    noun = singular if count == 1 else plural or f"{singular}s"
    return f"{count:,} {noun}" if abs(count) >= 10_000 else f"{count} {noun}"


def article(word: str) -> str:
    """``a`` or ``an`` before ``word``, by its first letter (good for kmq's role and type names)."""
    return "an" if word[:1].lower() in "aeiou" else "a"
