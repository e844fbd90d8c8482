"""The Overview's and the Breakers page's figures as an on-call person reads them (pure: rows
and times in, formatted rows and chart frames out)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kmq_dagster.audit.models import Alert, BreakerState, BreakerTransition, QueueSnapshot
from kmq_dagster.console.overview_format import (
    WINDOWS,
    alert_rows,
    arrival_frame,
    breaker_rows,
    dead_letters_text,
    summary_row,
    transition_rows,
    window_bucket_s,
)
from kmq_dagster.console.queries import QueueSummary

NOW = datetime(2026, 11, 25, 6, 30, 15, tzinfo=UTC)


def snapshot(age_ms: int | None) -> QueueSnapshot:
    return QueueSnapshot(
        at=NOW, queue_topic="orders", group_id="pricing", lag=12_345, inflight=0,
        oldest_unacked_age_ms=age_ms, in_rate=3.8183, ack_rate=0.0,
    )  # fmt: skip


def test_a_queue_row_shows_rates_ages_and_counts_as_people_read_them() -> None:
    changed = NOW - timedelta(seconds=95)
    row = summary_row(QueueSummary("orders", "pricing", {"new": 4}, snapshot(72_400), "half_open",
                                   changed), NOW + timedelta(seconds=12))  # fmt: skip
    assert (row["lag"], row["in flight"], row["oldest unacked"]) == ("12,345", "0", "1m 12s")
    assert (row["in"], row["acked"], row["snapshot age"]) == ("3.8 /s", "0 /s", "12s")
    assert row["breaker"] == "half-open for 1m 47s"
    assert row["dead letters"] == "4 new"
    assert list(row)[:4] == ["queue", "group", "breaker", "dead letters"]


def test_dead_letters_by_status_read_as_words() -> None:
    assert dead_letters_text({"new": 1_500, "discarded": 2}) == "1,500 new, 2 discarded"
    assert dead_letters_text({"new": 0}) == dead_letters_text({}) == "none"


def test_a_closed_breaker_shows_no_opened_at_and_alerts_spell_half_open_as_people_do() -> None:
    state = BreakerState(queue_topic="orders", group_id="pricing", state="closed",
                         opened_at_ms=1_795_461_928_000, cooldown_ms=20_000, version=3)  # fmt: skip
    (row,) = breaker_rows([(state, None)])
    assert (row["state"], row["opened at"]) == ("closed", "-")
    stored = "circuit breaker open -> half_open: cooldown over; half_openness stays"
    (alert,) = alert_rows([Alert(at=NOW, queue_topic="orders", group_id="pricing",
                                 severity="warning", message=stored)])  # fmt: skip
    assert alert["message"] == (
        "circuit breaker open -> half-open: cooldown over; half_openness stays"
    )


def test_nothing_in_flight_or_no_snapshot_shows_a_dash_never_none() -> None:
    idle = summary_row(QueueSummary("orders", "pricing", snapshot=snapshot(None)), NOW)
    assert idle["oldest unacked"] == "-"
    unmeasured = summary_row(QueueSummary("orders", "pricing", {"new": 1}), NOW)
    shown = [str(v) for v in unmeasured.values()]
    assert "None" not in shown and "nan" not in shown
    assert (unmeasured["lag"], unmeasured["in"], unmeasured["breaker"]) == ("-", "-", "-")


def test_arrival_buckets_follow_the_window() -> None:
    buckets = {label: window_bucket_s(length) for label, length in WINDOWS.items()}
    assert buckets == {"last hour": 60, "last 24 hours": 600, "last 7 days": 3_600}


def test_arrivals_fill_every_bucket_of_the_window_so_bars_spread_over_it() -> None:
    # given: an hour's window; three dead letters of one queue in two minutes, one of another
    since = NOW - timedelta(hours=1)
    minute = datetime(2026, 11, 25, 6, 0, tzinfo=UTC)
    rows = [
        {"at": minute, "queue": "orders / pricing", "dead letters": 2},
        {"at": minute + timedelta(minutes=20), "queue": "orders / pricing", "dead letters": 1},
        {"at": minute, "queue": "payments / ledger", "dead letters": 1},
    ]

    frame = arrival_frame(rows, since, NOW, 60)

    # then: one bar per minute from 05:30 to 06:30, labelled by the minute it starts
    assert len(frame) == 61
    assert frame.index[0] == datetime(2026, 11, 25, 5, 30, tzinfo=UTC)
    assert frame.index[-1] == datetime(2026, 11, 25, 6, 30, tzinfo=UTC)
    assert frame.loc[minute, "orders / pricing"] == 2
    assert frame.loc[minute + timedelta(minutes=20), "orders / pricing"] == 1
    assert frame["orders / pricing"].sum() == 3 and frame["payments / ledger"].sum() == 1
    assert frame.loc[minute + timedelta(minutes=1)].sum() == 0


def test_transitions_show_the_error_rate_as_the_percentage_the_reason_says() -> None:
    opened = BreakerTransition(at=NOW, queue_topic="orders", group_id="pricing",
                               from_state="closed", to_state="open", error_rate=1.0,
                               window_calls=20, window_ms=30_000,
                               reason="error rate 100% over 20 messages in 30s")  # fmt: skip
    probing = BreakerTransition(at=NOW, queue_topic="orders", group_id="pricing",
                                from_state="open", to_state="half_open", error_rate=0.0,
                                window_calls=0, window_ms=30_000,
                                reason="cooldown over: probing")  # fmt: skip

    rows = transition_rows([opened, probing])

    assert [(r["error rate"], r["messages judged"], r["to"]) for r in rows] == [
        ("100%", 20, "open"), ("-", 0, "half-open")]  # fmt: skip


def test_breakers_show_cooldowns_as_durations_and_alerts_whole() -> None:
    state = BreakerState(queue_topic="orders", group_id="pricing", state="open",
                         opened_at_ms=1_795_461_928_000, cooldown_ms=20_000, version=2)  # fmt: skip
    (row,) = breaker_rows([(state, None)])
    assert (row["cooldown"], row["opened at"], row["since"]) == (
        "20s", "2026-11-23 19:25:28 UTC", "-")  # fmt: skip
    long_text = "circuit breaker closed -> open: " + "payments API timed out; " * 20
    (alert,) = alert_rows([Alert(at=NOW, queue_topic="orders", group_id="pricing",
                                 severity="critical", message=long_text)])  # fmt: skip
    assert alert["message"] == long_text and alert["queue"] == "orders / pricing"
