"""A shared breaker whose audit store is down: the worker goes on with its own breaker, and the
transitions it could not write are written once the store answers again."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import OperationalError

from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker, State
from kmq_dagster.core.queue import Queue

QUEUE = Queue("orders", "billing", partitions=1)


class FlakyStore:
    """Stands in for the audit store: refuses every call while ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.transitions: list[dict[str, Any]] = []
        self.saved: list[str] = []

    def _check(self) -> None:
        if self.down:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    def breaker_state(self, _topic: str, _group: str) -> None:
        self._check()

    def save_breaker_state(self, _topic: str, _group: str, **fields: Any) -> bool:
        self._check()
        self.saved.append(fields["state"])
        return True

    def record_transition(self, **fields: Any) -> None:
        self._check()
        self.transitions.append(fields)

    def record_alert(self, **fields: Any) -> None:
        self._check()


def test_a_store_outage_neither_stops_the_worker_nor_loses_a_transition() -> None:
    store = FlakyStore()
    config = BreakerConfig(consecutive_failures=2, cooldown_ms=1_000, probes=1)
    breaker = SharedBreaker(CircuitBreaker(config), QUEUE, store=store)  # type: ignore[arg-type]
    # given the store is down
    store.down = True
    # when the handler fails twice in a row
    for now_ms in (0, 10):
        assert breaker.allows(now_ms)
        breaker.started()
        breaker.record(False, now_ms)
    # then the breaker opened on this worker's own count, and nothing was raised
    assert breaker.state is State.OPEN
    assert not breaker.allows(20)
    assert breaker.store_failures >= 2
    assert store.transitions == []
    # and once the store answers again, the transition it missed is written
    store.down = False
    breaker.allows(2_000)
    assert [t["to_state"] for t in store.transitions][:1] == ["open"]
