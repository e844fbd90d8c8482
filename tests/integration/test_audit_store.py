"""The audit store on real SQLite and a real PostgreSQL server: migrations, idempotent writes,
filters, several writers, and SQL-injection strings that match nothing and change nothing."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from kmq_dagster.audit.dead_letters import dead_letter_row
from kmq_dagster.audit.models import Base
from kmq_dagster.audit.store import HEAD_REVISION, AuditStore, DeadLetterFilter, schema_revision
from kmq_dagster.core.headers import DLQ_REASON, ERROR_MESSAGE, ERROR_TYPE
from kmq_dagster.errors import ConfigError
from tests.support.audit_revisions import engine_at_revision
from tests.support.injections import INJECTIONS

#: A time range holding every dead letter of these tests.
EVERY_TIME: dict[str, Any] = {
    "since": datetime(2000, 1, 1, tzinfo=UTC),
    "until": datetime(2100, 1, 1, tzinfo=UTC),
}


def row(offset: int, **overrides: Any) -> dict[str, Any]:
    headers = [(ERROR_TYPE, b"TimeoutError"), (ERROR_MESSAGE, b"upstream timed out"),
               (DLQ_REASON, b"failed 4 attempts")]  # fmt: skip
    base = dead_letter_row(
        dlq_topic="orders.billing.dlq",
        partition=offset % 2,
        offset=offset,
        key=f"k{offset}".encode(),
        value=b"v",
        headers=headers,
        timestamp_ms=1_795_000_000_000 + offset * 1000,
        queue_topic="orders",
        group_id="billing",
        ingested_at=datetime.now(UTC),
    )
    return {**base, **overrides}


def test_a_new_store_is_migrated_to_the_newest_schema_matching_the_models(store_url: str) -> None:
    store = AuditStore(store_url)

    assert schema_revision(store.engine) == HEAD_REVISION
    with store.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert differences == []
    AuditStore(store_url).close()  # opening again changes nothing
    store.close()


def test_upgrading_from_the_first_revision_keeps_the_data(store_url: str) -> None:
    engine = engine_at_revision(store_url, "0001")
    assert "breaker_states" not in inspect(engine).get_table_names()
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO actions (kind, actor, at, queue_topic, group_id, selection, count,"
                 " target, dry_run, outcome) VALUES ('replay', 'ops', :at, 'orders', 'billing',"
                 " 'every dead letter', 3, 'retry', false, 'replayed 3')"),
            {"at": datetime.now(UTC)},
        )  # fmt: skip
    engine.dispose()

    store = AuditStore(store_url)

    assert schema_revision(store.engine) == HEAD_REVISION
    assert [a.outcome for a in store.actions()] == ["replayed 3"]
    assert store.save_breaker_state(
        "orders", "billing", state="open", opened_at_ms=1, cooldown_ms=2, expected_version=None
    )
    store.close()


def test_dead_letters_are_stored_once_however_often_they_arrive(store_url: str) -> None:
    store = AuditStore(store_url)

    first = store.add_dead_letters([row(0), row(1), row(2)])
    again = store.add_dead_letters([row(1), row(2), row(3)])

    assert (first, again) == (3, 1)
    assert store.count_dead_letters() == 4
    store.close()


def test_filters_select_exactly_and_status_changes_stick(store_url: str) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([row(i) for i in range(6)])
    store.add_dead_letters([row(10, error_type="ValueError", error_message="bad 100% input")])
    start = datetime.fromtimestamp(1_795_000_002, UTC)

    assert store.count_dead_letters(DeadLetterFilter(error_type="ValueError")) == 1
    assert store.count_dead_letters(DeadLetterFilter(key=b"k3")) == 1
    assert store.count_dead_letters(DeadLetterFilter(text="100%")) == 1
    assert store.count_dead_letters(DeadLetterFilter(text="timed out")) == 6
    window = DeadLetterFilter(since=start, until=start + timedelta(seconds=2))
    assert sorted(d.dlq_offset for d in store.dead_letters(window)) == [2, 3]
    assert store.set_status("orders.billing.dlq", [(0, 2), (1, 3)], "replayed") == 2
    assert store.count_dead_letters(DeadLetterFilter(status="replayed")) == 2
    assert store.count_dead_letters(DeadLetterFilter(status="new", queue_topic="orders")) == 5
    with pytest.raises(ConfigError, match="status must be one of"):
        DeadLetterFilter(status="gone")
    store.close()


def injected_filters(attack: str) -> list[DeadLetterFilter]:
    """``attack`` in each text field of a filter, then in all of them at once within a time
    range that holds every dead letter."""
    fields: dict[str, Any] = {
        "queue_topic": attack, "group_id": attack, "error_type": attack,
        "key": attack.encode(), "text": attack,
    }  # fmt: skip
    return [
        *(DeadLetterFilter(**{name: value}) for name, value in fields.items()),
        DeadLetterFilter(**fields, **EVERY_TIME),
    ]


def test_injection_strings_through_every_filter_and_discard_match_nothing_and_change_nothing(
    store_url: str,
) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([row(i) for i in range(5)])
    store.record_action(
        kind="replay", actor="ops", queue_topic="orders", group_id="billing",
        selection="all", count=5, target="retry", dry_run=False, outcome="ok",
    )  # fmt: skip
    before = [(d.dlq_offset, d.status) for d in store.dead_letters()]
    # the time range alone selects them all
    assert store.count_dead_letters(DeadLetterFilter(**EVERY_TIME)) == 5

    discards = 0
    for attack in INJECTIONS:
        for where in injected_filters(attack):
            assert store.count_dead_letters(where) == 0, (attack, where)
            assert store.dead_letters(where) == []
            # discarding through the same filter, as a dry run and for real, changes nothing
            assert store.discard(where, actor=attack, dry_run=True) == 0
            assert store.discard(where, actor=attack) == 0
            discards += 2
        with pytest.raises(ConfigError, match="status must be one of"):
            DeadLetterFilter(status=attack)
        assert store.set_status(attack, [(0, 0)], "discarded") == 0
        assert store.actions(queue_topic=attack)  # the discards' actions, under the attack
        assert store.alerts(queue_topic=attack) == []
        assert store.transitions(attack, attack) == []
        assert store.breaker_state(attack, attack) is None

    assert [(d.dlq_offset, d.status) for d in store.dead_letters()] == before
    actions = store.actions()
    assert len(actions) == 1 + discards
    # the attack strings were stored as plain values in the discards' actions
    stored = {(a.actor, a.queue_topic, a.count) for a in actions[1:]}
    assert {actor for actor, _, _ in stored} == set(INJECTIONS)
    assert {topic for _, topic, _ in stored} == {*INJECTIONS, "*"}
    assert {count for _, _, count in stored} == {0}
    assert {"dead_letters", "actions"} <= set(inspect(store.engine).get_table_names())
    store.close()


def test_a_time_bound_that_is_not_a_datetime_is_refused_with_a_clear_error(
    store_url: str,
) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([row(i) for i in range(5)])
    try:
        for attack in INJECTIONS:
            for bound in ("since", "until"):
                not_a_datetime: dict[str, Any] = {bound: attack}
                with pytest.raises(ConfigError, match=bound):
                    DeadLetterFilter(**not_a_datetime)
    finally:
        assert store.count_dead_letters(DeadLetterFilter(status="new")) == 5
        store.close()


def test_only_one_of_two_racing_breaker_writes_wins(store_url: str) -> None:
    store = AuditStore(store_url)
    fields = {"opened_at_ms": 1, "cooldown_ms": 1_000}
    assert store.save_breaker_state("q", "g", state="open", expected_version=None, **fields)
    version = store.breaker_state("q", "g").version  # type: ignore[union-attr]

    wins = [
        store.save_breaker_state("q", "g", state=state, expected_version=version, **fields)
        for state in ("half_open", "closed")
    ]

    assert wins == [True, False]
    assert store.breaker_state("q", "g").state == "half_open"  # type: ignore[union-attr]
    store.close()


def _write_rows(url: str, first: int, count: int) -> None:
    store = AuditStore(url)
    for offset in range(first, first + count):
        store.add_dead_letters([row(offset)])
        store.record_alert(queue_topic="orders", group_id="billing", severity="info",
                           message=f"row {offset}")  # fmt: skip
    store.close()


def test_several_processes_write_one_sqlite_file_without_losing_a_row(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_rows, args=(url, i * 1_000, 150)) for i in range(4)]

    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)

    assert [w.exitcode for w in writers] == [0, 0, 0, 0]
    store = AuditStore(url)
    assert store.count_dead_letters() == 600
    assert len(store.alerts()) == 600
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.close()
