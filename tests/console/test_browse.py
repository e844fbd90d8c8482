"""Browsing the audit store on real SQLite and PostgreSQL: keyset pages that stay put while rows
arrive, every console filter, counts by cause, the coordinates a replay of a filter moves, and
injection strings that match nothing and change nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import inspect

from kmq_dagster.audit import browse
from kmq_dagster.audit.browse import cause_counts, dead_letter, dlq_selection, page, queues
from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.errors import ConfigError
from tests.console.conftest import BASE_MS, stored_row
from tests.support.injections import INJECTIONS


def at(seconds: int) -> datetime:
    return datetime.fromtimestamp(BASE_MS / 1000 + seconds, UTC)


def ids_of(rows: list) -> list[int]:  # type: ignore[type-arg]
    return [row.dlq_offset for row in rows]


def test_pages_list_every_row_once_newest_first_and_stay_put_while_rows_arrive(
    store_url: str,
) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([stored_row(n) for n in range(25)])
    # two rows failed in the same millisecond: the id breaks the tie
    store.add_dead_letters([stored_row(100, failed_ms=BASE_MS + 12_000)])

    first = page(store, DeadLetterFilter(), size=10)
    store.add_dead_letters([stored_row(n) for n in range(200, 230)])  # newer rows arrive
    second = page(store, DeadLetterFilter(), after=first.next_cursor, size=10)
    third = page(store, DeadLetterFilter(), after=second.next_cursor, size=10)

    assert ids_of(first.rows) == list(range(24, 14, -1))
    assert ids_of(second.rows) == [14, 13, 100, 12, 11, 10, 9, 8, 7, 6]
    assert ids_of(third.rows) == [5, 4, 3, 2, 1, 0]
    assert third.next_cursor is None
    assert ids_of(page(store, DeadLetterFilter(), size=10).rows)[:3] == [229, 228, 227]
    with pytest.raises(ConfigError, match="1 to 1000"):
        page(store, DeadLetterFilter(), size=0)
    store.close()


def test_every_console_filter_selects_exactly_its_rows(store_url: str) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([stored_row(n) for n in range(6)])
    store.add_dead_letters([
        stored_row(10, error_type="ValueError", message="bad amount -3", reason="non-retryable",
                   value=b'{"card_number": "4111"}', headers=[("trace-id", b"abc")]),
        stored_row(11, queue="payments", group="ledger", headers=[("trace-id", b"xyz")]),
        stored_row(12, value=b"\x00\xffbinary\x01", headers=[("flag", None)]),
        # garbage still gets a row on PostgreSQL, whose text columns refuse NUL characters
        stored_row(13, message="nul \x00 in the message", reason="nul \x00 reason",
                   headers=[("nul\x00name", b"\x00")]),
    ])  # fmt: skip
    everything = store.count_dead_letters()

    def offsets(**fields: object) -> list[int]:
        return sorted(ids_of(page(store, DeadLetterFilter(**fields), size=100).rows))  # type: ignore[arg-type]

    assert everything == 10
    assert offsets(queue_topic="payments", group_id="ledger") == [11]
    assert offsets(error_type="ValueError") == [10]
    assert offsets(error_pattern="order <n> timed out after <n> s") == [0, 1, 2, 3, 4, 5, 11, 12]
    assert offsets(search="in the message") == [13]
    assert offsets(reason="retryable") == [10]
    assert offsets(search="card_number") == [10]  # in the value
    assert offsets(search="amount -3") == [10]  # in the error message
    assert offsets(search="binary") == [12]  # in a binary value
    assert offsets(search="Card_Number") == []  # case-sensitive everywhere
    assert offsets(header=("trace-id", "abc")) == [10]
    assert offsets(header=("trace-id", None)) == [10, 11]
    assert offsets(header=("flag", None)) == [12]
    assert offsets(header=("trace-id", "ab")) == []
    assert offsets(key=b"k3") == [3]
    assert offsets(since=at(2), until=at(4)) == [2, 3]
    some = [row.id for row in page(store, DeadLetterFilter(key=b"k4"), size=1).rows]
    assert offsets(ids=tuple(some)) == [4]
    assert offsets(ids=()) == []
    with pytest.raises(ConfigError, match="kmq header"):
        DeadLetterFilter(header=("kmq-error-type", "ValueError"))
    with pytest.raises(ConfigError, match="before its end"):
        DeadLetterFilter(since=at(5), until=at(5))
    store.close()


def test_side_table_filters_give_the_same_pages_and_counts_when_they_match_many(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([
        stored_row(n, headers=[("tenant", f"t{n % 3}".encode())], reason=f"reason {n % 2}")
        for n in range(30)
    ])  # fmt: skip
    filters = [
        DeadLetterFilter(header=("tenant", "t1")),
        DeadLetterFilter(header=("tenant", None), reason="reason 1", search="order"),
        DeadLetterFilter(search="timed out", queue_topic="orders", status="new"),
        DeadLetterFilter(header=("tenant", "t2"), ids=(3, 6, 9, 12)),
    ]

    def answers() -> list[object]:
        found: list[object] = []
        for where in filters:
            first = page(store, where, size=4)
            after = first.next_cursor
            second = page(store, where, after=after, size=4).rows if after else []
            found.append((ids_of(first.rows), ids_of(second)))
            found.append([(c.error_pattern, c.count) for c in cause_counts(store, where)])
            found.append(dlq_selection(store, where).offsets)
        return found

    looked_up_by_id = answers()
    monkeypatch.setattr(browse, "NARROW_IDS", 0)  # every side filter "matches many"
    walked = answers()

    assert walked == looked_up_by_id
    pages = looked_up_by_id[0::3]
    assert pages == [
        ([28, 25, 22, 19], [16, 13, 10, 7]),  # tenant t1: offsets 1, 4, 7, ...
        ([29, 27, 25, 23], [21, 19, 17, 15]),  # odd reasons
        ([29, 28, 27, 26], [25, 24, 23, 22]),  # every row
        ([11, 8, 5, 2], []),  # ids 3, 6, 9, 12 are offsets 2, 5, 8, 11: all tenant t2
    ]
    assert looked_up_by_id[1] == [("order <n> timed out after <n> s", 10)]
    store.close()


def test_counts_by_cause_group_messages_that_differ_only_in_ids_and_numbers(
    store_url: str,
) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([stored_row(n) for n in range(7)])
    store.add_dead_letters([
        stored_row(20 + n, error_type="KeyError", message=f"'{field}'")
        for n, field in enumerate(["customer_id", "customer_id", "amount"])
    ])  # fmt: skip

    counts = cause_counts(store, DeadLetterFilter(queue_topic="orders"))

    assert [(c.error_type, c.error_pattern, c.count) for c in counts] == [
        ("TimeoutError", "order <n> timed out after <n> s", 7),
        ("KeyError", "'customer_id'", 2),
        ("KeyError", "'amount'", 1),
    ]
    assert counts[0].latest.replace(tzinfo=UTC) == at(6)
    assert cause_counts(store, DeadLetterFilter(queue_topic="nothing")) == []
    store.close()


def test_a_filter_resolves_to_the_dlq_offsets_of_one_queue_and_group(store_url: str) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([stored_row(n) for n in range(8)])
    store.add_dead_letters([stored_row(3, queue="payments")])

    selection = dlq_selection(store, DeadLetterFilter(queue_topic="orders", since=at(2)))

    assert (selection.queue_topic, selection.group_id) == ("orders", "billing")
    assert selection.dlq_topic == "orders.billing.dlq"
    assert selection.offsets == {0: [2, 4, 6], 1: [3, 5, 7]}
    assert selection.count == 6
    with pytest.raises(ConfigError, match=r"choose one queue and group.*payments / billing"):
        dlq_selection(store, DeadLetterFilter(key=b"k3"))
    with pytest.raises(ConfigError, match="selects no dead letters"):
        dlq_selection(store, DeadLetterFilter(queue_topic="none"))
    assert queues(store) == [("orders", "billing"), ("payments", "billing")]
    store.close()


def test_injection_strings_through_every_console_filter_match_nothing_and_change_nothing(
    store_url: str,
) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([stored_row(n, headers=[("h", b"v")]) for n in range(5)])
    before = [(d.id, d.status, d.error_pattern) for d in store.dead_letters()]

    for attack in INJECTIONS:
        filters = [
            DeadLetterFilter(queue_topic=attack),
            DeadLetterFilter(group_id=attack),
            DeadLetterFilter(error_type=attack),
            DeadLetterFilter(error_pattern=attack),
            DeadLetterFilter(key=attack.encode()),
            DeadLetterFilter(text=attack),
            DeadLetterFilter(reason=attack),
            DeadLetterFilter(search=attack),
            DeadLetterFilter(header=(attack, attack)),
            DeadLetterFilter(header=("h", attack)),
            DeadLetterFilter(header=(attack, None)),
        ]
        for where in filters:
            assert page(store, where).rows == [], (attack, where)
            assert cause_counts(store, where) == []
            with pytest.raises(ConfigError):
                dlq_selection(store, where)
            assert store.discard(where, actor=attack, reason=attack) == 0

    assert [(d.id, d.status, d.error_pattern) for d in store.dead_letters()] == before
    assert dead_letter(store, before[0][0]) is not None
    tables = set(inspect(store.engine).get_table_names())
    assert {"dead_letters", "dead_letter_headers", "dead_letter_events", "actions"} <= tables
    store.close()


def test_a_dead_letter_is_found_by_id_and_a_missing_one_is_none(store_url: str) -> None:
    store = AuditStore(store_url)
    store.add_dead_letters([stored_row(1)])
    (row,) = store.dead_letters()

    found = dead_letter(store, row.id)

    assert found is not None and found.key == b"k1"
    assert found.error_pattern == "order <n> timed out after <n> s"
    assert dead_letter(store, row.id + 1000) is None
    assert page(store, DeadLetterFilter(until=at(1) + timedelta(seconds=1))).rows[0].id == row.id
    store.close()
