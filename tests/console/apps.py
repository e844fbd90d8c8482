"""Running the console in ``AppTest``: the real app script, a real SQLite store, a logged-in
principal, and helpers to find what a page shows."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

from kmq_dagster.console.auth import Principal
from kmq_dagster.console.config import USERS_FILE_ENV
from kmq_dagster.console.session import PRINCIPAL_KEY

APP = Path(__file__).resolve().parents[2] / "kmq_dagster" / "console" / "app.py"
PAGES = {
    "overview": "views/overview.py",
    "dead letters": "views/dead_letters.py",
    "actions": "views/actions.py",
    "breakers": "views/breakers.py",
}


def open_app(principal: Principal | None = None, page: str = "overview") -> AppTest:
    """The app, run once on ``page`` (logged in as ``principal`` when given)."""
    app = AppTest.from_file(str(APP), default_timeout=60)
    if principal is not None:
        enroll(principal)
        app.session_state[PRINCIPAL_KEY] = principal
    app.run()
    if page != "overview":
        app.switch_page(PAGES[page]).run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def enroll(principal: Principal) -> None:
    """Put ``principal`` in the users file the console reads (every action re-reads it), with
    a placeholder hash: these sessions are logged in without a password."""
    path = Path(os.environ[USERS_FILE_ENV])
    content = json.loads(path.read_text()) if path.exists() else {"users": {}}
    content["users"][principal.name] = {"role": principal.role, "password_hash": "placeholder"}
    path.write_text(json.dumps(content))


def texts(app: AppTest) -> str:
    """Everything the page shows as text, alerts and captions included, one per line."""
    parts = [
        *(e.value for e in app.text), *(e.value for e in app.code), *(e.value for e in app.error),
        *(e.value for e in app.info), *(e.value for e in app.success),
        *(e.value for e in app.warning), *(e.value for e in app.caption),
        *(e.value for e in app.title), *(e.value for e in app.subheader),
    ]  # fmt: skip
    # Alerts show data with markdown escaped (rendering.escape_markdown): read it back plain.
    return re.sub(r"\\(.)", r"\1", "\n".join(str(part) for part in parts))


def button(app: AppTest, label_start: str):  # type: ignore[no-untyped-def]
    """The one button whose label starts with ``label_start``."""
    found = [b for b in app.button if str(b.label).startswith(label_start)]
    assert len(found) == 1, [b.label for b in app.button]
    return found[0]


def has_button(app: AppTest, label_start: str) -> bool:
    return any(str(b.label).startswith(label_start) for b in app.button)


def records(table) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """A shown table's rows, texts read back plain (``st.table`` cells are markdown-escaped:
    :func:`kmq_dagster.console.rendering.static_table`)."""
    return [
        {k: re.sub(r"\\(.)", r"\1", v) if isinstance(v, str) else v for k, v in row.items()}
        for row in table.value.to_dict("records")
    ]
