"""The Dead letters page in ``AppTest`` over a real SQLite store: filters, keyset pages, the
by-cause view and its click, selection, the detail (masked), the discard flow, the viewer's
read-only page, and injection strings typed into every filter field."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from streamlit.testing.v1 import AppTest

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.history import history
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console import dead_letter_grid
from kmq_dagster.console.auth import OPERATOR, VIEWER, Principal
from kmq_dagster.console.dead_letter_grid import list_columns, list_frame, message_width_px
from kmq_dagster.console.filter_form import filter_text, widget_key
from tests.console.apps import button, has_button, open_app, texts
from tests.console.conftest import BASE_MS, stored_row
from tests.support.injections import INJECTIONS

OLIVIA = Principal("olivia", OPERATOR)
VICTOR = Principal("victor", VIEWER)
CARD = "4111111111111111"


def fill(url: str) -> AuditStore:
    """60 timeouts, 3 KeyErrors (two causes), one with a secret and XSS in it."""
    store = AuditStore(url)
    store.add_dead_letters([stored_row(n) for n in range(60)])
    store.add_dead_letters([
        stored_row(100, error_type="KeyError", message="'customer_id'"),
        stored_row(101, error_type="KeyError", message="'customer_id'"),
        stored_row(102, error_type="KeyError", message="'amount'",
                   value=json.dumps({"card_number": CARD, "note": "<img src=x>"}).encode(),
                   headers=[("Authorization", b"Bearer s3cr3t"), ("trace-id", b"t-102")]),
    ])  # fmt: skip
    return store


def apply_filters(app: AppTest, **fields: str) -> None:
    for name, value in fields.items():
        widget = app.selectbox(key=widget_key(name)) if name in ("queue", "status") else None
        if widget is not None:
            widget.select(value)
        else:
            app.text_input(key=widget_key(name)).input(value)
    button(app, "Apply filters").click().run()
    assert not app.exception, [e.value for e in app.exception]


def select_rows(app: AppTest, rows: list[int]) -> None:
    """Tick ``rows`` of the list, as a click on their checkboxes does."""
    key = app.dataframe[0].key
    assert key is not None
    app.session_state[key] = {"selection": {"rows": rows, "columns": []}}


def listed(app: AppTest) -> list[int]:
    return [int(i) for i in app.dataframe[0].value["id"]]


def ids_of(store: AuditStore, **fields: object) -> list[int]:
    return [d.id for d in store.dead_letters(DeadLetterFilter(**fields), limit=1000)]  # type: ignore[arg-type]


def test_filters_and_keyset_pages_list_every_matching_dead_letter_once(
    console_env: Path, private_audit_store: str
) -> None:
    store = fill(private_audit_store)
    app = open_app(OLIVIA, page="dead letters")

    first = listed(app)
    button(app, "Older").click().run()
    second = listed(app)

    assert len(first) == 50 and len(second) == 13
    assert first + second == ids_of(store)  # newest first, each once
    assert "Page 2: 13 of 63 matching" in texts(app)
    button(app, "Newer").click().run()
    assert listed(app) == first
    apply_filters(app, error_type="KeyError")
    assert listed(app) == ids_of(store, error_type="KeyError")
    apply_filters(app, error_type="", header="trace-id=t-102")
    assert listed(app) == ids_of(store, key=b"k102")
    apply_filters(app, header="", search="customer", since="2026-11-18T11:08:21")
    assert listed(app) == ids_of(store, key=b"k101")
    apply_filters(app, since="yesterday")
    assert "not a time: 'yesterday'" in texts(app)
    store.close()


def test_the_by_cause_view_counts_causes_and_a_click_filters_the_list(
    console_env: Path, private_audit_store: str
) -> None:
    store = fill(private_audit_store)
    app = open_app(OLIVIA, page="dead letters")

    app.segmented_control(key="dead-letters-view").set_value("By cause").run()
    causes = app.dataframe[0].value
    rows = zip(causes["error type"], causes["error pattern"], causes["count"], strict=True)
    assert list(rows) == [
        ("TimeoutError", "order <n> timed out after <n> s", 60),
        ("KeyError", "'customer_id'", 2),
        ("KeyError", "'amount'", 1),
    ]
    assert not app.get("vega_lite_chart")  # the counts are bars in the table itself
    app.session_state["causes-table-0"] = {"selection": {"rows": [1], "columns": []}}
    app.run()

    assert app.segmented_control(key="dead-letters-view").value == "List"
    assert listed(app) == ids_of(store, error_type="KeyError", error_pattern="'customer_id'")
    assert app.text_input(key=widget_key("error_pattern")).value == "'customer_id'"
    store.close()


def test_the_detail_shows_value_headers_error_and_history_with_secrets_masked(
    console_env: Path, private_audit_store: str
) -> None:
    store = fill(private_audit_store)
    store.discard(DeadLetterFilter(key=b"k102"), actor="sam", reason="duplicate order")
    app = open_app(VICTOR, page="dead letters")
    apply_filters(app, status="any", key="k102")
    (only,) = listed(app)

    app.selectbox[-1].select(only).run()

    assert app.json[0].value == json.dumps({"card_number": "****", "note": "<img src=x>"})
    facts = dict(zip(app.dataframe[1].value["field"], app.dataframe[1].value["value"], strict=True))
    assert facts["status"] == "discarded" and facts["error type"] == "KeyError"
    assert facts["original coordinates"] == "orders [0] @ 102"
    headers = app.dataframe[2].value.to_dict("records")
    assert {"name": "Authorization", "value": "****", "encoding": "utf-8"} in headers
    assert {"name": "trace-id", "value": "t-102", "encoding": "utf-8"} in headers
    assert "'amount'" in texts(app)
    steps = app.dataframe[3].value.to_dict("records")
    assert [(s["what"], s["by"], s["detail"]) for s in steps] == [
        ("dead-lettered", "", "failed 4 attempts"),
        ("discard", "sam", "duplicate order"),
    ]
    exported = [d for d in app.get("download_button") if "JSON" in d.proto.label]
    assert exported and CARD not in str(app.get("download_button"))
    for shown in ("Hex", "Text"):
        app.selectbox(key=f"format-{only}").select(shown).run()
        assert CARD not in texts(app) and "****" in texts(app)
    store.close()


def test_a_viewer_sees_no_replay_or_discard_control(
    console_env: Path, private_audit_store: str
) -> None:
    fill(private_audit_store).close()
    app = open_app(VICTOR, page="dead letters")
    select_rows(app, [0, 1])
    app.run()

    assert not any(has_button(app, label) for label in ("Replay", "Discard"))
    assert "replay and discard need the operator role" in texts(app)


def test_an_operator_discards_the_selected_rows_with_a_reason_and_it_is_audited(
    console_env: Path, private_audit_store: str
) -> None:
    store = fill(private_audit_store)
    app = open_app(OLIVIA, page="dead letters")
    select_rows(app, [0, 2])
    app.run()
    chosen = [listed(app)[0], listed(app)[2]]

    button(app, "Discard selected (2)").click().run()
    assert "2 new dead letters would be marked discarded" in texts(app)
    button(app, "Discard 2 dead letters").click().run()
    assert "a discard needs a reason" in texts(app)
    assert store.dead_letters(DeadLetterFilter(status="discarded")) == []
    app.text_input(key="discard-reason").input("test orders").run()
    button(app, "Discard 2 dead letters").click().run()

    assert "Discarded 2 dead letters." in texts(app)
    assert sorted(ids_of(store, status="discarded")) == sorted(chosen)
    (action,) = store.actions()
    assert (action.actor, action.kind, action.outcome) == ("olivia", "discard",
                                                           "discarded 2: test orders")  # fmt: skip
    discarded = store.dead_letters(DeadLetterFilter(status="discarded"))
    assert [e.actor for e in history(store, discarded[0])][-1] == "olivia"
    store.close()


def test_injection_strings_typed_into_every_filter_match_nothing_and_change_nothing(
    console_env: Path, private_audit_store: str
) -> None:
    store = fill(private_audit_store)
    before = [(d.id, d.status) for d in store.dead_letters(limit=1000)]
    app = open_app(OLIVIA, page="dead letters")

    rows = store.dead_letters(limit=1000)
    for attack in INJECTIONS:
        # substring filters find the string literally (a "_" in "customer_id"), nothing more
        literally = {
            "search": [d.id for d in rows
                       if attack in (d.value or b"").decode() + d.error_message],
            "reason": [d.id for d in rows if attack in d.reason],
        }  # fmt: skip
        fields = ("error_type", "error_pattern", "reason", "key", "search")
        for field in fields:
            apply_filters(app, **{other: attack if other == field else "" for other in fields})
            assert listed(app) == literally.get(field, []), (field, attack)
        apply_filters(app, search="", header=f"{attack}={attack}")
        assert listed(app) == []
        apply_filters(app, header="")

    assert [(d.id, d.status) for d in store.dead_letters(limit=1000)] == before
    assert store.actions() == []
    assert BASE_MS  # the rows are the fixture's
    store.close()


def test_the_filter_reads_as_words_not_as_code() -> None:
    where = DeadLetterFilter(
        queue_topic="orders", group_id="billing", status="new", error_type="TimeoutError",
        key=b"\xff\x01", header=("trace-id", None),
        since=datetime(2026, 11, 23, 10, 0, tzinfo=UTC),
    )  # fmt: skip
    assert filter_text(where) == (
        "new dead letters of orders / billing, error type TimeoutError, key 0xff01, "
        "header trace-id, since 2026-11-23 10:00:00 UTC"
    )
    assert filter_text(DeadLetterFilter()) == "dead letters of any status"


def test_the_list_fits_its_columns_to_a_laptop_and_cuts_long_texts_with_an_ellipsis() -> None:
    # given: the columns the default filter shows (any queue, new)
    columns = list_columns(DeadLetterFilter(status="new"))
    assert "status" not in columns and "queue / group" in columns
    assert sum(dead_letter_grid.WIDTHS_PX[c] for c in columns if c != "error message") + (
        message_width_px(columns)) == dead_letter_grid.LIST_WIDTH_PX  # fmt: skip
    table = pd.DataFrame([{"id": 1, "last failure": datetime(2026, 11, 23, 10, 0),
                           "queue": "orders", "group": "billing", "status": "new",
                           "error type": "TimeoutError", "error message": "timed out " * 40,
                           "reason": "failed 4 attempts, the last with TimeoutError",
                           "key": "k1"}])  # fmt: skip
    (row,) = list_frame(table, DeadLetterFilter(status="new")).to_dict("records")
    assert row["reason"] == "failed 4 attempts, the last with TimeoutError"  # whole
    assert row["error message"].endswith("\N{HORIZONTAL ELLIPSIS}")
    assert row["last failure"] == "2026-11-23 10:00:00"
    assert row["queue / group"] == "orders / billing"
