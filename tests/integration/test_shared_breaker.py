"""Several workers share one breaker through a real SQLite audit store (fake clock)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kmq_dagster.audit.breaker_state import StoredBreaker
from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker, Sample, State, judge_samples
from kmq_dagster.core.queue import Queue

CONFIG = BreakerConfig(min_calls=4, consecutive_failures=4, cooldown_ms=1_000, probes=1)


def workers(store: AuditStore, count: int) -> list[SharedBreaker]:
    return [
        SharedBreaker(
            CircuitBreaker(CONFIG), Queue("orders", "billing"), store=store, sync_interval_ms=0
        )
        for _ in range(count)
    ]


def fail(breaker: SharedBreaker, times: int, now_ms: int) -> None:
    for _ in range(times):
        assert breaker.allows(now_ms)
        breaker.started()
        breaker.record(False, now_ms)


def test_one_worker_opening_stops_every_worker_and_only_one_probes(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    a, b, c = workers(store, 3)

    fail(a, 4, now_ms=1_000)

    assert not b.allows(1_001) and not c.allows(1_001)  # they read the store and stop too
    probing = [w.allows(2_000) for w in (a, b, c)]
    assert probing.count(True) == 1  # the first to see the cooldown end probes; others wait
    prober = (a, b, c)[probing.index(True)]
    prober.started()
    prober.record(True, 2_001)
    assert all(w.allows(2_002) for w in (a, b, c))
    states = [(t.from_state, t.to_state) for t in store.transitions("orders", "billing")]
    assert states == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_a_silent_prober_is_replaced(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    a, b = workers(store, 2)
    b.probe_timeout_ms = 5_000
    fail(a, 4, now_ms=0)
    assert a.allows(1_000)  # a probes... and dies without an outcome
    assert not b.allows(1_001)

    assert b.allows(7_000)  # quiet for longer than the probe timeout: b takes over
    assert b.state is State.HALF_OPEN


def test_at_the_default_sync_interval_one_worker_opening_stops_every_worker_within_a_second(
    tmp_path: Path,
) -> None:
    # given three workers of one group as `kmq worker --breaker` builds them (default sync)
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    config = replace(CONFIG, cooldown_ms=60_000)  # no probing within the second looked at
    a, b, c = (SharedBreaker.for_queue(Queue("orders", "billing"), store, config) for _ in "abc")
    # b and c are working; c read the store the very moment before a opens the breaker
    assert b.allows(10_000)
    assert c.allows(10_400)

    # when a opens it at 10,400 ms
    fail(a, 4, now_ms=10_400)
    assert a.state is State.OPEN

    # then, one second later, neither b nor c takes another message
    assert not b.allows(11_400)
    assert not c.allows(11_400)
    assert b.state is State.OPEN and c.state is State.OPEN


def test_the_breaker_sensor_and_the_workers_write_one_row_with_one_writer(tmp_path: Path) -> None:
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    (worker,) = workers(store, 1)
    sensor = StoredBreaker(store, Queue("orders", "billing"), window_ms=CONFIG.window_ms,
                           source="breaker sensor")  # fmt: skip
    # given: the sensor opens the breaker on a tick's samples
    opened = judge_samples(
        State.CLOSED, opened_at_ms=0, cooldown_ms=CONFIG.cooldown_ms,
        samples=[Sample(500, 10, 10)], now_ms=500, config=CONFIG,
    )  # fmt: skip
    assert opened is not None and sensor.write(opened, expected_version=None)
    # then: the worker follows it, and probes once the cooldown is over
    assert not worker.allows(600) and worker.state is State.OPEN
    read = sensor.read()
    assert worker.allows(1_500) and worker.breaker.state is State.HALF_OPEN
    # when: the sensor decides the same probing on the version it read before the worker wrote
    assert read is not None and read.state is State.OPEN
    probing = judge_samples(
        read.state, opened_at_ms=read.opened_at_ms, cooldown_ms=read.cooldown_ms, samples=[],
        now_ms=1_600, config=CONFIG,
    )  # fmt: skip
    assert probing is not None and probing.to_state is State.HALF_OPEN
    # then: its write loses, and each transition is stored and alerted once, whoever decided it
    assert not sensor.write(probing, expected_version=read.version)
    transitions = [(t.to_state, t.reason) for t in store.transitions("orders", "billing")]
    assert transitions == [
        ("open", "error rate 100% over 10 messages in 30s (copies to the retry topics) "
                 "(breaker sensor)"),
        ("half_open", "cooldown over: probing"),
    ]  # fmt: skip
    assert [a.severity for a in store.alerts("orders")] == ["critical", "warning"]
