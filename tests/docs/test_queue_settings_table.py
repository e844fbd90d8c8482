"""The table of a queue's settings in docs/reference/configuration.md is the model's
(``core/queue_settings.py``): every setting with its Python keyword, YAML key, ``kmq`` option and
range, so the reference can neither miss a setting nor keep a range that changed."""

from __future__ import annotations

from pathlib import Path

from kmq_dagster.core.queue_settings import (
    BREAKER_SETTINGS,
    PROCESSING_SETTINGS,
    QUEUE_SETTINGS,
    RETRY_SETTINGS,
    Kind,
    Setting,
)

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"
BEGIN = "<!-- queue settings: begin (tests/docs/test_queue_settings_table.py writes it) -->"
END = "<!-- queue settings: end -->"

#: Where each table's settings go in Python, and under which YAML key.
PLACES = (
    ("Queue", "", QUEUE_SETTINGS),
    ("RetryPolicy", "retry.", RETRY_SETTINGS),
    ("QueueSpec", "", PROCESSING_SETTINGS),
    ("BreakerConfig", "breaker.", BREAKER_SETTINGS),
)


def values(setting: Setting) -> str:
    if setting.bounded:
        return setting.bounds()
    if setting.kind is Kind.CHOICE:
        return ", ".join(f"`{choice}`" for choice in setting.choices)
    return {Kind.GROUP: "see below", Kind.TEXTS: "list"}.get(setting.kind, setting.kind.value)


def table() -> str:
    lines = [
        "| Python | YAML | `kmq` option | values | meaning |",
        "|---|---|---|---|---|",
    ]
    for owner, prefix, settings in PLACES:
        for setting in settings:
            # the text a policy is made from
            made_by = f"{owner}.from_options" if setting.name in ("delays", "backoff") else owner
            flag = f"`{setting.flag}`" if setting.flag else ""
            meaning = setting.help.replace("|", "\\|")
            if setting.default_note:
                meaning += f" (default: {setting.default_note})"
            lines.append(
                f"| `{made_by}({setting.name})` | `{prefix}{setting.yaml_key}` | {flag} | "
                f"{values(setting)} | {meaning} |"
            )
    return "\n".join(lines)


def test_the_reference_lists_every_setting_of_the_model() -> None:
    text = REFERENCE.read_text()
    written = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()

    assert written == table(), "paste this table between the markers:\n" + table()
