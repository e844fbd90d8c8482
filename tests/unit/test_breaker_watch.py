"""The breaker watcher's state machine on per-tick samples, and which transitions alert."""

from __future__ import annotations

from kmq_dagster.core.breaker import BreakerConfig, Sample, State, Transition, judge_samples
from kmq_dagster.core.breaker_alerts import AlertState, TransitionEvent, last_closed_ms, next_alert
from kmq_dagster.core.breaker_samples import Unsettled, settle

CONFIG = BreakerConfig(window_ms=30_000, min_calls=20, error_rate=0.5, cooldown_ms=10_000, probes=3)
NOW = 1_000_000


def move(
    state: str,
    samples: list[Sample],
    *,
    opened_at_ms: int = 0,
    cooldown_ms: int = 10_000,
    now_ms: int = NOW,
    closed_at_ms: int = 0,
) -> Transition | None:
    return judge_samples(
        State(state), opened_at_ms=opened_at_ms, cooldown_ms=cooldown_ms, samples=samples,
        now_ms=now_ms, config=CONFIG, closed_at_ms=closed_at_ms,
    )  # fmt: skip


def test_a_flood_inside_the_window_opens_it() -> None:
    opened = move("closed", [Sample(NOW - 5_000, 10, 9), Sample(NOW, 20, 12)])
    assert opened is not None
    assert (opened.to_state, opened.opened_at_ms, opened.window_calls) == ("open", NOW, 30)
    assert opened.reason == "error rate 70% over 30 messages in 30s (copies to the retry topics)"


def test_failures_outside_the_window_or_below_min_calls_do_not_open_it() -> None:
    assert move("closed", [Sample(NOW - 31_000, 100, 100), Sample(NOW, 10, 1)]) is None
    assert move("closed", [Sample(NOW, 19, 19)]) is None  # under min_calls
    assert move("closed", [Sample(NOW, 40, 19)]) is None  # under the error rate


def test_a_breaker_that_just_closed_judges_only_what_happened_since() -> None:
    # As in `kmq demo --ui`: the probe's 24 messages closed it at NOW - 15 s; a Spark batch
    # then wrote 14 retry copies (flaky orders) before its successes counted as processed.
    probe, mid_batch = Sample(NOW - 16_000, 24, 0), Sample(NOW, 0, 14)
    closed_at = NOW - 15_000
    assert move("closed", [probe, mid_batch], closed_at_ms=closed_at) is None
    # A real flood after the close still opens it at once.
    flood = Sample(NOW, 30, 25)
    opened = move("closed", [probe, flood], closed_at_ms=closed_at)
    assert opened is not None and opened.window_calls == 30
    assert last_closed_ms(events("open", "half_open", "closed", "open")) == 2_000
    assert last_closed_ms(events("open")) == 0


def test_a_spark_batchs_failures_count_with_its_messages_at_its_commit() -> None:
    # mid-batch: 280 messages went in flight (start markers), 14 of them failed and were copied
    # to a retry topic and ended; the group's offsets have not moved yet
    mid, unsettled = settle(NOW - 5_000, -(280 - 14), 14, Unsettled())
    assert (mid.processed, mid.failures) == (0, 0)
    # the batch commits its offsets: 280 consumed, 266 leave the in-flight figure
    end, unsettled = settle(NOW, 280 + 266, 0, unsettled)
    assert (end.processed, end.failures) == (280, 14)
    assert unsettled == Unsettled()
    # 5% of 280 is no flood; judged on the mid-batch tick alone it was 100%
    assert move("closed", [mid, end]) is None


def test_a_workers_failures_count_at_once() -> None:
    # a worker commits what it fetched, then finishes each message: copies are finished ones
    sample, unsettled = settle(NOW, 100, 30, Unsettled())
    assert (sample.processed, sample.failures, unsettled) == (100, 30, Unsettled())
    flood, _ = settle(NOW, 40, 40, Unsettled())
    opened = move("closed", [flood])
    assert opened is not None and opened.to_state == "open"


def test_an_open_breaker_probes_after_its_cooldown_never_before() -> None:
    assert move("open", [], opened_at_ms=NOW - 9_999) is None
    probing = move("open", [], opened_at_ms=NOW - 10_000)
    assert probing is not None and probing.to_state == "half_open"


def test_probing_judges_enough_messages_by_the_error_rate() -> None:
    began = NOW - 10_000  # opened at began - cooldown
    kwargs = {"opened_at_ms": began - 10_000}
    # the outage's failures before probing began do not count; two messages are not enough
    assert move("half_open", [Sample(began - 1, 50, 50), Sample(NOW, 2, 0)], **kwargs) is None
    closed = move("half_open", [Sample(NOW, 30, 2)], **kwargs)  # one flaky order is no outage
    assert closed is not None and closed.to_state == "closed"
    assert closed.reason == "28 of 30 messages processed while probing"
    reopened = move("half_open", [Sample(NOW, 4, 2)], **kwargs)
    assert reopened is not None
    assert (reopened.to_state, reopened.cooldown_ms, reopened.opened_at_ms) == ("open", 20_000, NOW)


def events(*states: str) -> list[TransitionEvent]:
    pairs = zip(("closed", *states), states, strict=False)
    return [
        TransitionEvent(i + 1, State(a), State(b), i * 1_000, "why")
        for i, (a, b) in enumerate(pairs)
    ]


def test_one_alert_per_transition_and_a_resolve_at_once() -> None:
    # when: the breaker opens
    decision, state = next_alert(AlertState(), events("open"), NOW, 300_000)
    assert decision is not None and decision.transition.to_state == "open"
    # then: the same transition never alerts twice
    assert next_alert(state, events("open"), NOW + 1, 300_000)[0] is None
    # when: it closes a few seconds later, the resolve goes out at once, not after the period
    resolved, state = next_alert(state, events("open", "half_open", "closed"), NOW + 5, 300_000)
    assert resolved is not None and resolved.resolve and resolved.folded == 2
    assert not state.problem_announced


def test_a_flapping_breaker_alerts_at_most_once_per_period() -> None:
    _, state = next_alert(AlertState(), events("open"), NOW, 60_000)
    _, state = next_alert(state, events("open", "half_open", "closed"), NOW + 5, 60_000)
    flapping = events("open", "half_open", "closed", "open", "half_open", "open")
    # the resolve went out at once; the flapping reopen waits for the period
    held, held_state = next_alert(state, flapping, NOW + 1_000, 60_000)
    assert held is None and held_state == state
    later, _ = next_alert(state, flapping, NOW + 60_005, 60_000)
    assert later is not None
    assert (later.transition.id, later.folded, later.resolve) == (6, 3, False)


def test_a_close_nobody_was_told_about_is_not_resolved() -> None:
    # the open was held by the period, so its close needs no resolve message
    _, state = next_alert(AlertState(), events("open"), NOW, 60_000)
    _, state = next_alert(state, events("open", "half_open", "closed"), NOW + 5, 60_000)
    held_open = events("open", "half_open", "closed", "open", "half_open", "closed")
    decision, after = next_alert(state, held_open, NOW + 1_000, 60_000)
    assert decision is None
    assert after.last_transition_id == 6
