"""MkDocs hook: the docstrings use Sphinx roles (:class:`Worker`), which mkdocstrings renders
literally; show them as the code they name."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:py:)?(?:meth|class|func|attr|mod|data|exc|obj):(?=<code>)")


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub("", html)
