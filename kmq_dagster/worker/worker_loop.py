"""The serial worker loop (one handler call at a time, in fetch order) and what every worker
loop shares: the consumer it needs (:class:`LoopConsumer`) and the counts it keeps
(:class:`WorkerStats`). :class:`~kmq_dagster.worker.worker.Worker` picks this loop at
concurrency 1 and :class:`~kmq_dagster.worker.concurrent_loop.ConcurrentLoop` above.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kmq_dagster.core.breaker import GroupBreaker, State
from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.core.wait_histogram import WaitHistogram
from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.kafka.retry_router import RetryRouter, failure_of, logged_error_text
from kmq_dagster.worker.handler_call import HandlerCall

log = logging.getLogger(__name__)

Handler = Callable[[KmqMessage], object]


@dataclass
class WorkerStats:
    """A loop's counts: written by its thread only, read by any (logs, ``--metrics-port``)."""

    handled: int = 0
    failed: int = 0
    #: Failures retried in place (key order): retries that never reach a retry topic.
    retried_in_place: int = 0
    #: Handler calls running now.
    calls_in_flight: int = 0
    #: Fetched messages waiting to start: their lane busy, their retry not due, no free
    #: slot, or the breaker open.
    held: int = 0
    #: Waits from fetch to first call start (the concurrent loop; ``None`` at concurrency 1).
    waits: WaitHistogram | None = None


class LoopConsumer(Protocol):
    """What :class:`WorkerLoop` uses of a consumer: :class:`KmqConsumer` has it, and so has
    the unit tests' fake (mypy checks both against it)."""

    @property
    def visibility_timeout_ms(self) -> int: ...

    def poll(self, timeout_s: float = ...) -> list[KmqMessage]: ...

    def ack(self, message: KmqMessage) -> None: ...

    def nack(self, message: KmqMessage) -> None: ...

    def extend(self, message: KmqMessage, seconds: float) -> None: ...

    def hold_fetching(self, hold: bool) -> None: ...


class WorkerLoop:
    """One worker's steps, on any :class:`LoopConsumer` and a :class:`RetryRouter` (the unit
    tests run it on a fake consumer and a router over a fake producer)."""

    def __init__(
        self,
        consumer: LoopConsumer,
        handler: Handler,
        stop: threading.Event,
        *,
        router: RetryRouter | None,
        breaker: GroupBreaker | None,
        clock_ms: Callable[[], int],
    ) -> None:
        self.consumer = consumer
        self.handler = handler if isinstance(handler, HandlerCall) else HandlerCall(handler)
        self.stop = stop
        self.router = router
        self.breaker = breaker
        self.clock_ms = clock_ms
        self.stats = WorkerStats()
        self.exit_code: int | None = None
        self.held: list[KmqMessage] = []
        #: Failed while the breaker is open: kept to be probed or handled after recovery.
        self._requeued: list[KmqMessage] = []
        self._extended_at_ms = 0

    def drain(self, timeout_s: float) -> None:
        """Nothing to wait for: a stopped serial loop has no call running."""

    def close(self) -> None:
        """Nothing to free: calls run on the loop's own thread."""

    def step(self) -> None:
        allowed = self.breaker is None or self.breaker.allows(self.clock_ms())
        if self.breaker is not None:
            self.consumer.hold_fetching(bool(self.held) or not allowed)
        waiting = bool(self.held) and allowed
        batch = self.held + self.consumer.poll(timeout_s=0.0 if waiting else 0.5)
        self.held = []
        failed: list[tuple[KmqMessage, Failure | str]] = []
        for index, message in enumerate(batch):
            if self.stop.is_set():
                break  # not acknowledged: redelivered after its visibility timeout
            if self.breaker is not None and not self.breaker.allows(self.clock_ms()):
                self.held = batch[index:]
                break
            self._handle(message, failed)
        self.held += self._requeued
        self._requeued = []
        self.stats.held = len(self.held)
        if failed and self.router is not None:
            routed = self.router.route(failed)
            for message in routed:
                self.consumer.ack(message)
            unrouted = [m for m, _ in failed if all(m is not r for r in routed)]
            for message in unrouted:
                self.consumer.nack(message)  # the copy failed: redeliver rather than lose it
        self._keep_held_visible()

    def _handle(self, message: KmqMessage, failed: list[tuple[KmqMessage, Failure | str]]) -> None:
        problem = self.router.metadata_problem(message) if self.router else None
        if problem is not None:
            failed.append((message, problem))
            return
        if self.breaker is not None:
            self.breaker.started()
        self.stats.calls_in_flight = 1
        try:
            self.handler(message)
        except KeyboardInterrupt:
            log.warning("handler interrupted on %r; stopping, it will be redelivered", message)
            self.stop.set()
        except SystemExit as exc:
            self.exit_code = exc.code if isinstance(exc.code, int) else 1
            log.warning(
                "handler called exit(%s) on %r; stopping, it will be redelivered", exc.code, message
            )
            self.stop.set()
        except BaseException as exc:  # GeneratorExit and the like too: failed, never lost
            self._failed(message, exc, failed)
        else:
            self.consumer.ack(message)
            self.stats.handled += 1
            if self.breaker is not None:
                self.breaker.record(True, self.clock_ms())
        finally:
            self.stats.calls_in_flight = 0

    def _failed(
        self,
        message: KmqMessage,
        exc: BaseException,
        failed: list[tuple[KmqMessage, Failure | str]],
    ) -> None:
        self.stats.failed += 1
        shown = logged_error_text(exc)
        log.info("handler failed on %r: %s: %s", message, type(exc).__name__, shown)
        fatal = self.router is not None and not self.router.policy.is_retryable(exc)
        if self.breaker is not None and fatal:
            self.breaker.release()
        elif self.breaker is not None:
            # Bad input (a fatal error) says nothing about the downstream service: it is not
            # recorded at all, neither as a failure nor as a success.
            self.breaker.record(False, self.clock_ms())
            if self.breaker.state is not State.CLOSED:
                # The outage, not the message: keep it for a probe or for after recovery
                # instead of spending one of its retries.
                self._requeued.append(message)
                return
        if self.router is None:
            self.consumer.nack(message)
        else:
            failed.append((message, failure_of(exc)))

    def _keep_held_visible(self) -> None:
        if not self.held:
            self._extended_at_ms = 0
            return
        now_ms = self.clock_ms()
        if not self._extended_at_ms:
            self._extended_at_ms = now_ms  # just fetched: a full visibility timeout ahead
            return
        visibility_ms = self.consumer.visibility_timeout_ms
        if now_ms - self._extended_at_ms >= visibility_ms // 3:
            for message in self.held:
                self.consumer.extend(message, visibility_ms / 1000)
            self._extended_at_ms = now_ms
