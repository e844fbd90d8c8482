"""A reference dead letter (a message too large to copy, issue 34 item 2) in the console's
detail: it says so, with the size and where the message is, in ``AppTest`` over SQLite."""

from __future__ import annotations

from pathlib import Path

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.auth import VIEWER, Principal
from kmq_dagster.core.oversize import OVERSIZE_BYTES, VALUE_REF
from tests.console.apps import open_app, texts
from tests.console.conftest import stored_row
from tests.console.test_dead_letters_page import apply_filters, listed


def test_the_detail_of_a_reference_shows_its_size_and_where_the_message_is(
    console_env: Path, private_audit_store: str
) -> None:
    # given a reference dead letter, as the worker writes one for a 2 MB message at orders[0]@7
    store = AuditStore(private_audit_store)
    reason = "too large to copy: a record of 2,048,000 bytes was refused for orders.g.retry.1m"
    store.add_dead_letters([
        stored_row(7, value=b"", reason=reason,
                   headers=[(VALUE_REF, b"orders/0/7"), (OVERSIZE_BYTES, b"2048000")]),
        stored_row(8),
    ])  # fmt: skip
    app = open_app(Principal("victor", VIEWER), page="dead letters")
    apply_filters(app, key="k7")
    (only,) = listed(app)

    app.selectbox[-1].select(only).run()

    # then its facts and its Value tab say it is a reference, how large, and where
    facts = dict(zip(app.dataframe[1].value["field"], app.dataframe[1].value["value"], strict=True))
    assert facts["value size"] == (
        "2,048,000 bytes, not in the DLQ: too large to copy; a reference to orders [0] @ 7 "
        "(replay reads it from there)"
    )
    assert facts["reason"] == reason
    (note,) = [i.value for i in app.info]
    assert "Too large to copy (2,048,000 bytes)" in note and "orders [0] @ 7" in note
    assert "(no value)" not in texts(app)
    store.close()
