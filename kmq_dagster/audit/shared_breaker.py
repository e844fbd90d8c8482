"""One circuit breaker per queue topic and group, shared by every worker process through the
audit store.

Each worker runs a local :class:`~kmq_dagster.core.breaker.CircuitBreaker` on its own outcomes.
A state change is written to the store through
:class:`~kmq_dagster.audit.breaker_state.StoredBreaker` (compare-and-set on a version, as the
breaker sensor writes its own); the writer that wins records the transition and its alert and
calls the alert hook, a loser adopts what the store holds. Workers re-read the store every
``sync_interval_ms``, so one worker opening the breaker stops them all.
Only the worker that moved the breaker to HALF_OPEN sends probes; if it goes quiet for
``probe_timeout_ms``, another worker takes the probing over.

While the audit store is down, each worker keeps going on its local breaker: a store error is
logged and counted (``store_failures``), never raised into the worker, and the transitions it
could not write (with their alerts) are written once the store answers again; the
``on_transition`` hook is called at once all the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from kmq_dagster.audit.breaker_state import SharedState, StoredBreaker
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.breaker import BreakerConfig, CircuitBreaker, State, Transition
from kmq_dagster.core.queue import Queue

log = logging.getLogger(__name__)

AlertHook = Callable[[Transition], None]
#: The longest an open breaker waits before probing again, however often probes failed.
MAX_COOLDOWN_MS = 300_000
#: Transitions kept to be written while the store is down (the oldest are dropped past this).
MAX_UNWRITTEN_TRANSITIONS = 1_000


class SharedBreaker:
    """The breaker of ``queue`` (its topic and group) as one worker sees it."""

    def __init__(
        self,
        breaker: CircuitBreaker,
        queue: Queue,
        *,
        store: AuditStore | None = None,
        on_transition: AlertHook | None = None,
        sync_interval_ms: int = 1_000,
        probe_timeout_ms: int = 60_000,
    ) -> None:
        self.breaker = breaker
        self.queue = queue
        self.topic = queue.topic
        self.group = queue.group
        self.store = store
        self._stored = (
            StoredBreaker(store, queue, window_ms=breaker.config.window_ms) if store else None
        )
        self.on_transition = on_transition
        self.sync_interval_ms = sync_interval_ms
        self.probe_timeout_ms = probe_timeout_ms
        self._version: int | None = None
        self._probing = True
        self._last_sync_ms: int | None = None
        self._seen_since_ms = 0
        #: Store calls that failed (the store was down); the worker went on regardless.
        self.store_failures = 0
        self._unwritten: list[Transition] = []

    @classmethod
    def for_queue(
        cls,
        queue: Queue,
        store: AuditStore,
        config: BreakerConfig | None = None,
        *,
        on_transition: AlertHook | None = None,
    ) -> SharedBreaker:
        """The breaker a group's workers share through ``store``; every transition is also
        written to the store's alerts, and passed to ``on_transition`` (e.g. to page someone).

        Build ``config`` with :func:`breaker_config` to get the usual cooldown cap.
        """
        breaker = CircuitBreaker(config or BreakerConfig())
        return cls(breaker, queue, store=store, on_transition=on_transition)

    @property
    def state(self) -> State:
        return self.breaker.state

    def allows(self, now_ms: int) -> bool:
        """May this worker process one more message now?"""
        self._sync(now_ms)
        moved = self.breaker.advance(now_ms)
        if moved is not None:
            self._publish(moved, now_ms)
        if self.breaker.state is State.HALF_OPEN and not self._probing:
            return False
        return self.breaker.allows()

    def started(self) -> None:
        self.breaker.started()

    def release(self) -> None:
        """The started message's outcome does not count (bad input)."""
        self.breaker.release()

    def record(self, ok: bool, now_ms: int) -> None:
        moved = self.breaker.record(ok, now_ms)
        if moved is not None:
            self._publish(moved, now_ms)

    def _publish(self, transition: Transition, now_ms: int) -> None:
        if self._stored is None:
            self._announce(transition)
            return
        try:
            won = self._stored.save(
                transition.to_state,
                transition.opened_at_ms,
                transition.cooldown_ms,
                expected_version=self._version,
            )
        except SQLAlchemyError as exc:
            # The store is down: this worker acts on its own decision, written later.
            self._store_failed(exc)
            self._keep_unwritten(transition)
            self._announce(transition)
            return
        if not won:  # another worker decided first: follow it
            self._sync(now_ms, force=True)
            return
        self._version = (self._version or 0) + 1
        self._probing = True
        self._seen_since_ms = now_ms
        self._keep_unwritten(transition)
        self._write_unwritten()
        self._announce(transition)

    def _keep_unwritten(self, transition: Transition) -> None:
        self._unwritten.append(transition)
        del self._unwritten[:-MAX_UNWRITTEN_TRANSITIONS]

    def _write_unwritten(self) -> None:
        """Record the transitions not yet in the store, oldest first, while it answers."""
        assert self._stored is not None
        while self._unwritten:
            try:
                self._stored.record(self._unwritten[0])
            except SQLAlchemyError as exc:
                self._store_failed(exc)
                return
            del self._unwritten[0]

    def _store_failed(self, exc: SQLAlchemyError) -> None:
        self.store_failures += 1
        log.warning(
            "audit store unavailable for the breaker of %s / %s (going on with this worker's "
            "own state): %s",
            self.topic,
            self.group,
            str(exc).splitlines()[0],
        )

    def _announce(self, transition: Transition) -> None:
        log.warning(
            "circuit breaker of %s / %s: %s -> %s (%s)",
            self.topic,
            self.group,
            transition.from_state.value,
            transition.to_state.value,
            transition.reason,
        )
        if self.on_transition is not None:
            try:
                self.on_transition(transition)
            except Exception:  # an alert hook must never stop the worker
                log.exception("the breaker's alert hook failed")

    def _sync(self, now_ms: int, *, force: bool = False) -> None:
        if self._stored is None:
            return
        last_ms = self._last_sync_ms
        if not force and last_ms is not None and now_ms - last_ms < self.sync_interval_ms:
            return
        self._last_sync_ms = now_ms
        try:
            row = self._stored.read()
        except SQLAlchemyError as exc:
            self._store_failed(exc)
            return
        self._write_unwritten()
        if row is None:
            if self._version is not None:  # the row was deleted: start afresh
                self._version = None
            return
        if row.version != self._version:
            self._adopt(row, now_ms)
        elif self._stale_probe(row, now_ms):
            log.warning("probing of %s / %s went quiet; taking it over", self.topic, self.group)
            self._take_over_probing(row, now_ms)

    def _adopt(self, row: SharedState, now_ms: int) -> None:
        self.breaker.adopt(row.state, row.opened_at_ms, row.cooldown_ms)
        self._version = row.version
        self._probing = False
        self._seen_since_ms = now_ms

    def _stale_probe(self, row: SharedState, now_ms: int) -> bool:
        return (
            row.state is State.HALF_OPEN
            and not self._probing
            and now_ms - self._seen_since_ms > self.probe_timeout_ms
        )

    def _take_over_probing(self, row: SharedState, now_ms: int) -> None:
        assert self._stored is not None
        try:
            taken = self._stored.save(
                row.state, row.opened_at_ms, row.cooldown_ms, expected_version=row.version
            )
        except SQLAlchemyError as exc:
            self._store_failed(exc)
            return
        if taken:
            self._version = row.version + 1
            self.breaker.adopt(State.HALF_OPEN, row.opened_at_ms, row.cooldown_ms)
            self._probing = True
            self._seen_since_ms = now_ms


def breaker_config(
    *,
    window_ms: int,
    error_rate: float,
    min_calls: int,
    cooldown_ms: int,
    probes: int,
) -> BreakerConfig:
    """A breaker configuration whose cooldown doubles per failed probe up to
    :data:`MAX_COOLDOWN_MS`, or stays at ``cooldown_ms`` if that is longer.

    Raises:
        ConfigError: a value out of range.
    """
    return BreakerConfig(
        window_ms=window_ms,
        min_calls=min_calls,
        error_rate=error_rate,
        cooldown_ms=cooldown_ms,
        max_cooldown_ms=max(cooldown_ms, MAX_COOLDOWN_MS),
        probes=probes,
    )
