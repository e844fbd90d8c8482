"""The worker loop behind ``kmq worker``: a handler per message, an ack when it returns."""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kmq_dagster.audit.shared_breaker import SharedBreaker
from kmq_dagster.core.breaker import State
from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage
from kmq_dagster.kafka.retry_router import RetryRouter, failure_of

log = logging.getLogger(__name__)

Handler = Callable[[KmqMessage], object]


@dataclass
class WorkerStats:
    handled: int = 0
    failed: int = 0


def load_handler(spec: str) -> Handler:
    """Import ``package.module:function``.

    Raises:
        ConfigError: malformed spec, module not importable, or attribute not callable.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"--handler takes package.module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import handler module {module_name!r}: {exc}") from None
    handler = getattr(module, attribute, None)
    if not callable(handler):
        raise ConfigError(f"{module_name} has no callable {attribute!r}")
    return handler  # type: ignore[no-any-return]


def run_worker(
    consumer: KmqConsumer,
    handler: Handler,
    stop: threading.Event,
    on_batch: Callable[[WorkerStats], None] | None = None,
    router: RetryRouter | None = None,
    *,
    breaker: SharedBreaker | None = None,
    clock_ms: Callable[[], int] = wall_clock_ms,
) -> WorkerStats:
    """Handle messages until ``stop`` is set.

    Returning acknowledges a message. Raising sends it to its retry topic or the DLQ through
    ``router`` (acknowledged once the copy is durable); without a router it is redelivered.
    ``KeyboardInterrupt`` and ``SystemExit`` in a handler stop the worker; the message they
    interrupted is neither acknowledged nor lost: its visibility timeout redelivers it.

    With a ``breaker``, handler outcomes feed it (errors the retry policy treats as fatal are
    bad input, not an outage, and do not count). While it does not allow processing, the
    worker stops fetching and holds the messages it has, extending their visibility; nothing
    is acknowledged, routed or lost meanwhile. A message that fails while the breaker is open
    (the one that opened it, a failed probe) is held too, at the back, rather than sent to a
    retry topic: the outage is not its fault and must not use up its retries.
    """
    loop = _WorkerLoop(consumer, handler, stop, router=router, breaker=breaker, clock_ms=clock_ms)
    try:
        while not stop.is_set():
            loop.step()
            if on_batch is not None:
                on_batch(loop.stats)
    finally:
        consumer.close()
        if router is not None:
            router.close()
    return loop.stats


class _WorkerLoop:
    def __init__(
        self,
        consumer: KmqConsumer,
        handler: Handler,
        stop: threading.Event,
        *,
        router: RetryRouter | None,
        breaker: SharedBreaker | None,
        clock_ms: Callable[[], int],
    ) -> None:
        self.consumer = consumer
        self.handler = handler
        self.stop = stop
        self.router = router
        self.breaker = breaker
        self.clock_ms = clock_ms
        self.stats = WorkerStats()
        self.held: list[KmqMessage] = []
        #: Failed while the breaker is open: kept to be probed or handled after recovery.
        self._requeued: list[KmqMessage] = []
        self._extended_at_ms = 0

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
        try:
            self.handler(message)
        except (KeyboardInterrupt, SystemExit):
            log.warning("handler interrupted on %r; stopping, it will be redelivered", message)
            self.stop.set()
        except Exception as exc:
            self.stats.failed += 1
            log.info("handler failed on %r: %s: %s", message, type(exc).__name__, exc)
            if self.breaker is not None:
                fatal = self.router is not None and not self.router.policy.is_retryable(exc)
                self.breaker.record(fatal, self.clock_ms())
                if not fatal and self.breaker.state is not State.CLOSED:
                    # The outage, not the message: keep it for a probe or for after recovery
                    # instead of spending one of its retries.
                    self._requeued.append(message)
                    return
            if self.router is None:
                self.consumer.nack(message)
            else:
                failed.append((message, failure_of(exc)))
        else:
            self.consumer.ack(message)
            self.stats.handled += 1
            if self.breaker is not None:
                self.breaker.record(True, self.clock_ms())

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
