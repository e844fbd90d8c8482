"""Fixtures of the console tests: empty audit stores on SQLite and PostgreSQL, and dead-letter
rows shaped like the ingester's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from streamlit import config as streamlit_config

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.console.config import AUTH_ENV, USERS_FILE_ENV
from kmq_dagster.console.login_guard import reset_throttle
from kmq_dagster.core.headers import (
    DLQ_REASON,
    ERROR_MESSAGE,
    ERROR_TYPE,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
)

#: 2026-11-18 11:06:40 UTC: dead letter ``n`` failed ``n`` seconds later.
BASE_MS = 1_795_000_000_000


def stored_row(
    offset: int,
    *,
    queue: str = "orders",
    group: str = "billing",
    error_type: str = "TimeoutError",
    message: str | None = None,
    reason: str = "failed 4 attempts",
    value: bytes | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
    original_offset: int | None = None,
    failed_ms: int | None = None,
) -> dict[str, Any]:
    """The row the ingester stores for DLQ record ``offset`` (partition ``offset % 2``)."""
    kmq = [
        (ERROR_TYPE, error_type.encode()),
        (ERROR_MESSAGE, (message or f"order {offset} timed out after 30 s").encode()),
        (DLQ_REASON, reason.encode()),
        (ORIGINAL_TOPIC, queue.encode()),
        (ORIGINAL_PARTITION, b"0"),
        (ORIGINAL_OFFSET, str(offset if original_offset is None else original_offset).encode()),
    ]
    return dead_letter_row(
        dlq_topic=f"{queue}.{group}.dlq",
        partition=offset % 2,
        offset=offset,
        key=f"k{offset}".encode(),
        value=value if value is not None else f'{{"order": {offset}}}'.encode(),
        headers=[*(headers or []), *kmq],
        timestamp_ms=failed_ms if failed_ms is not None else BASE_MS + offset * 1000,
        queue_topic=queue,
        group_id=group,
        ingested_at=datetime.now(UTC),
    )


@pytest.fixture
def console_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A users-file console served on loopback; yields the users file's path."""
    users = tmp_path / "users.json"
    monkeypatch.setenv(USERS_FILE_ENV, str(users))
    monkeypatch.delenv(AUTH_ENV, raising=False)
    reset_throttle()
    before = streamlit_config.get_option("server.address")
    streamlit_config.set_option("server.address", "127.0.0.1")
    yield users
    streamlit_config.set_option("server.address", before)
