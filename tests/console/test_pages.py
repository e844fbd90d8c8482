"""The Overview, Actions and Breakers & alerts pages in ``AppTest`` over a real SQLite store:
what they show with rows and without, and the replay jobs' progress and cancel."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console import jobs
from kmq_dagster.console.auth import OPERATOR, VIEWER, Principal
from tests.console.apps import has_button, open_app, records, texts
from tests.console.conftest import stored_row

OPERATOR_OLIVIA = Principal("olivia", OPERATOR)


def test_the_overview_says_when_there_are_no_snapshots_yet(
    console_env: Path, private_audit_store: str
) -> None:
    app = open_app(OPERATOR_OLIVIA)

    shown = texts(app)
    assert "No queue has dead letters, snapshots or a circuit breaker yet." in shown
    assert "No queue snapshots yet" in shown
    assert "No snapshots in this window." in shown


def test_the_overview_shows_each_queue_with_its_newest_snapshot_counts_and_breaker(
    console_env: Path, private_audit_store: str
) -> None:
    store = AuditStore(private_audit_store)
    now = datetime.now(UTC)
    store.add_dead_letters([stored_row(n, failed_ms=int(now.timestamp() * 1000) - n * 60_000)
                            for n in range(5)])  # fmt: skip
    store.set_status("orders.billing.dlq", [(1, 1)], "replayed")
    for lag in (500, 120):
        store.record_snapshot(queue_topic="orders", group_id="billing", lag=lag, inflight=7,
                              oldest_unacked_age_ms=4_500, in_rate=10.0, ack_rate=9.5)  # fmt: skip
    store.save_breaker_state("orders", "billing", state="open", opened_at_ms=1, cooldown_ms=10_000,
                             expected_version=None)  # fmt: skip
    store.record_transition(queue_topic="orders", group_id="billing", at=now, from_state="closed",
                            to_state="open", error_rate=1.0, window_calls=20, window_ms=30_000,
                            reason="10 failures in a row")  # fmt: skip

    app = open_app(OPERATOR_OLIVIA)

    (table,) = app.table
    (row,) = records(table)
    assert (row["queue"], row["group"], row["lag"], row["in flight"]) == ("orders", "billing",
                                                                          "120", "7")  # fmt: skip
    assert (row["oldest unacked"], row["dead letters"]) == ("4s", "4 new, 1 replayed")
    assert (row["in"], row["acked"]) == ("10.0 /s", "9.5 /s")
    assert row["breaker"].startswith("open for ")
    assert "No queue snapshots yet" not in texts(app)
    assert len(app.get("vega_lite_chart")) == 2  # lag and arrivals
    assert app.selectbox(key="overview-window").value == "last hour"
    for window in ("last 24 hours", "last 7 days"):  # arrivals per 10 minutes, per hour
        app.selectbox(key="overview-window").select(window).run()
        assert not app.exception and len(app.get("vega_lite_chart")) == 2
    assert "No alerts raised." in texts(app)
    store.record_alert(queue_topic="orders", group_id="billing", severity="critical",
                       message="circuit breaker closed -> open: " + "timeout; " * 40)  # fmt: skip
    _, alerts = open_app(OPERATOR_OLIVIA).table
    assert [a["message"] for a in records(alerts)] == [
        "circuit breaker closed -> open: " + "timeout; " * 40]  # fmt: skip
    store.close()


def test_breakers_and_alerts_list_states_transitions_and_alerts(
    console_env: Path, private_audit_store: str
) -> None:
    empty = open_app(Principal("victor", VIEWER), page="breakers")
    assert "No circuit breaker has been used" in texts(empty)
    assert "No alerts raised." in texts(empty)
    store = AuditStore(private_audit_store)
    store.save_breaker_state("payments", "ledger", state="half_open", opened_at_ms=1_000,
                             cooldown_ms=20_000, expected_version=None)  # fmt: skip
    store.record_transition(queue_topic="payments", group_id="ledger", at=datetime.now(UTC),
                            from_state="open", to_state="half_open", error_rate=0.0,
                            window_calls=0, window_ms=30_000, reason="cooldown over")  # fmt: skip
    store.record_alert(queue_topic="payments", group_id="ledger", severity="warning",
                       message="<b>breaker</b> half-open")  # fmt: skip

    app = open_app(Principal("victor", VIEWER), page="breakers")

    states, transitions, alerts = (records(t) for t in app.table)
    assert [(s["queue"], s["state"], s["cooldown"]) for s in states] == [
        ("payments", "half-open", "20s")]  # fmt: skip
    assert [(t["from"], t["to"], t["error rate"], t["reason"]) for t in transitions] == [
        ("open", "half-open", "-", "cooldown over")]  # fmt: skip
    assert [(a["severity"], a["message"]) for a in alerts] == [
        ("warning", "<b>breaker</b> half-open")
    ]
    store.close()


def test_actions_show_the_audit_trail_filtered_by_kind_and_actor(
    console_env: Path, private_audit_store: str
) -> None:
    store = AuditStore(private_audit_store)
    for kind, actor in [("replay", "olivia"), ("discard", "olivia"), ("replay", "sam")]:
        store.record_action(
            kind=kind, actor=actor, queue_topic="orders", group_id="billing", selection="s",
            count=3, target=None, dry_run=False, outcome="done",
        )  # fmt: skip
    app = open_app(OPERATOR_OLIVIA, page="actions")

    trail = app.dataframe[-1].value
    assert list(trail["actor"]) == ["sam", "olivia", "olivia"]  # newest first
    app.selectbox(key="actions-kind").select("replay").run()
    assert list(app.dataframe[-1].value["actor"]) == ["sam", "olivia"]
    app.text_input(key="actions-actor").input("olivia").run()
    assert list(app.dataframe[-1].value["kind"]) == ["replay"]
    store.close()


def test_a_running_replay_shows_progress_and_an_operator_cancels_it_a_viewer_cannot(
    console_env: Path,
) -> None:
    release = threading.Event()
    job = jobs.ReplayJob("olivia", "orders", "billing", "orders.billing.retry.1s", expected=40)

    def work(job: jobs.ReplayJob) -> str:
        job.update(scanned=25, replayed=10)
        release.wait(30)
        return "cancelled: replayed 10 of 25" if job.cancel.is_set() else "replayed 40"

    jobs.start(job, work)
    try:
        viewer = open_app(Principal("victor", VIEWER), page="actions")
        assert "10 of 40 replayed, 25 scanned" in str([p.proto for p in viewer.get("progress")])
        assert not has_button(viewer, "Cancel")

        app = open_app(OPERATOR_OLIVIA, page="actions")
        app.button(key=f"cancel-{job.id}").click().run()

        assert job.cancel.is_set()
    finally:
        release.set()
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while job.state == jobs.RUNNING and datetime.now(UTC) < deadline:
        release.wait(0.05)
    assert job.state == jobs.CANCELLED
    done = open_app(OPERATOR_OLIVIA, page="actions")
    assert "cancelled: replayed 10 of 25" in texts(done)
