"""A worker's breaker and the breaker sensor run one state machine: fed the same messages with
the same settings, they decide alike; where they differ, it is by how they judge probes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from kmq_dagster.core.breaker import (
    BreakerConfig,
    CircuitBreaker,
    Sample,
    State,
    Transition,
    judge_samples,
)
from tests.unit.test_breaker import CONFIG as UNIT_CONFIG

#: One probe, and no consecutive-failures rule (a sensor cannot see the order of a batch's
#: failures): the settings under which a worker and the sensor must agree on every move.
CONFIG = dataclasses.replace(UNIT_CONFIG, consecutive_failures=1_000_000, probes=1)


@dataclass
class Sensor:
    """The breaker sensor's loop without Dagster: the stored state, and one sample per call."""

    config: BreakerConfig
    state: State = State.CLOSED
    opened_at_ms: int = 0
    cooldown_ms: int = 1_000
    closed_at_ms: int = 0
    samples: list[Sample] = field(default_factory=list)

    def tick(self, now_ms: int) -> Transition | None:
        moved = judge_samples(
            self.state, opened_at_ms=self.opened_at_ms, cooldown_ms=self.cooldown_ms,
            samples=self.samples, now_ms=now_ms, config=self.config,
            closed_at_ms=self.closed_at_ms,
        )  # fmt: skip
        if moved is not None:
            self.state, self.opened_at_ms = moved.to_state, moved.opened_at_ms
            self.cooldown_ms = moved.cooldown_ms
            if moved.to_state is State.CLOSED:
                self.closed_at_ms = now_ms
        return moved


def evidence(transition: Transition) -> tuple[object, ...]:
    """Everything but the reason's words ("calls" for a worker, "messages" for the sensor)."""
    t = transition
    return (t.from_state, t.to_state, t.at_ms, t.error_rate, t.window_calls, t.opened_at_ms,
            t.cooldown_ms)  # fmt: skip


@given(st.lists(st.tuples(st.integers(1, 3_000), st.booleans()), max_size=300))
def test_fed_the_same_calls_a_worker_and_the_sensor_make_the_same_moves(
    history: list[tuple[int, bool]],
) -> None:
    worker, sensor = CircuitBreaker(CONFIG), Sensor(CONFIG)
    now_ms = 0
    for step_ms, ok in history:
        now_ms += step_ms
        # given: time passes (an open breaker may start probing) ...
        by_worker = [worker.advance(now_ms)]
        by_sensor = [sensor.tick(now_ms) if sensor.state is State.OPEN else None]
        # ... and the message offered now is processed if the breaker lets it through
        if worker.allows():
            worker.started()
            by_worker.append(worker.record(ok, now_ms))
            sensor.samples.append(Sample(now_ms, 1, 0 if ok else 1))
            by_sensor.append(sensor.tick(now_ms))
        # then: both made the same moves, on the same evidence, to the same stored state
        assert [evidence(t) for t in by_worker if t] == [evidence(t) for t in by_sensor if t]
        assert worker.state is sensor.state


def test_a_worker_reopens_on_one_failed_probe_and_the_sensor_on_the_error_rate() -> None:
    # given: both breakers open, three probes, and a probe round of 1 failure in 3 messages
    config = BreakerConfig(min_calls=4, error_rate=0.5, cooldown_ms=1_000, probes=3)
    worker = CircuitBreaker(config)
    worker.adopt(State.HALF_OPEN, opened_at_ms=0, cooldown_ms=1_000)
    outcomes = [True, False, True]
    # when: the worker sees the calls one by one, the sensor sees them as one batch
    by_worker = [worker.record(ok, 2_000) for ok in outcomes]
    by_sensor = judge_samples(
        State.HALF_OPEN, opened_at_ms=0, cooldown_ms=1_000, samples=[Sample(2_000, 3, 1)],
        now_ms=2_000, config=config,
    )  # fmt: skip
    # then: the worker reopened at the failed probe, as a single failure is all it sees then
    reopened = by_worker[1]
    assert reopened is not None and reopened.to_state is State.OPEN
    assert reopened.reason == "1 of 2 probe calls failed; cooldown 2s"
    # and the sensor closed: one ordinary failure among a batch's successes is no outage
    assert by_sensor is not None and by_sensor.to_state is State.CLOSED
    assert by_sensor.reason == "2 of 3 messages processed while probing"
    # and a batch failing at the error rate reopens it with the same cooldown growth
    failing = judge_samples(
        State.HALF_OPEN, opened_at_ms=0, cooldown_ms=1_000, samples=[Sample(2_000, 4, 2)],
        now_ms=2_000, config=config,
    )  # fmt: skip
    assert failing is not None
    assert (failing.to_state, failing.cooldown_ms) == (State.OPEN, reopened.cooldown_ms)
