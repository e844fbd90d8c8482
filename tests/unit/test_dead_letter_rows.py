"""A dead-letter record becomes a store row whatever its headers hold."""

from __future__ import annotations

from datetime import UTC, datetime

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.audit.models import MAX_STORED_VALUE_BYTES
from kmq_dagster.core.headers import ERROR_TYPE
from kmq_dagster.core.retry_headers import ATTEMPT, FIRST_FAILURE_MS


def test_a_value_over_the_cap_is_stored_cut_and_garbage_headers_read_as_unknown() -> None:
    big = b"x" * (MAX_STORED_VALUE_BYTES + 10)
    headers = [("bad", b"\xff\xfe"), ("none", None), (ATTEMPT, b"lots"), (ERROR_TYPE, b"\xff")]

    stored = dead_letter_row(
        dlq_topic="t.g.dlq", partition=0, offset=0, key=None, value=big, headers=headers,
        timestamp_ms=5_000, queue_topic="t", group_id="g", ingested_at=datetime.now(UTC),
    )  # fmt: skip

    assert stored["value_truncated"] and stored["value_size"] == len(big)
    assert len(stored["value"]) == MAX_STORED_VALUE_BYTES
    assert stored["headers"][:2] == [["bad", "//4=", True], ["none", None, False]]
    assert (stored["reason"], stored["attempts"]) == ("unknown", 1)
    assert stored["error_type"] == "\ufffd"
    assert stored["first_failure_at"] == stored["last_failure_at"] == datetime.fromtimestamp(5, UTC)


def test_the_first_failure_time_comes_from_its_header() -> None:
    stored = dead_letter_row(
        dlq_topic="t.g.dlq", partition=1, offset=9, key=b"k", value=None,
        headers=[(FIRST_FAILURE_MS, b"1000")], timestamp_ms=9_000, queue_topic="t", group_id="g",
        ingested_at=datetime.now(UTC),
    )  # fmt: skip

    assert stored["first_failure_at"] == datetime.fromtimestamp(1, UTC)
    assert (stored["value"], stored["value_size"], stored["value_truncated"]) == (None, 0, False)
