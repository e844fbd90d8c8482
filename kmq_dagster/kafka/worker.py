"""The worker loop behind ``kmq worker``: a handler per message, an ack when it returns."""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.errors import ConfigError
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
) -> WorkerStats:
    """Handle messages until ``stop`` is set.

    Returning acknowledges a message. Raising sends it to its retry topic or the DLQ through
    ``router`` (acknowledged once the copy is durable); without a router it is redelivered.
    ``KeyboardInterrupt`` and ``SystemExit`` in a handler stop the worker; the message they
    interrupted is neither acknowledged nor lost: its visibility timeout redelivers it.
    """
    stats = WorkerStats()
    try:
        while not stop.is_set():
            failed: list[tuple[KmqMessage, Failure | str]] = []
            for message in consumer.poll(timeout_s=0.5):
                if stop.is_set():
                    break  # not acknowledged: redelivered after its visibility timeout
                problem = router.metadata_problem(message) if router else None
                if problem is not None:
                    failed.append((message, problem))
                    continue
                try:
                    handler(message)
                except (KeyboardInterrupt, SystemExit):
                    log.warning(
                        "handler interrupted on %r; stopping, it will be redelivered", message
                    )
                    stop.set()
                    break
                except Exception as exc:
                    stats.failed += 1
                    log.info("handler failed on %r: %s: %s", message, type(exc).__name__, exc)
                    if router is None:
                        consumer.nack(message)
                    else:
                        failed.append((message, failure_of(exc)))
                else:
                    consumer.ack(message)
                    stats.handled += 1
            if failed and router is not None:
                routed = router.route(failed)
                for message in routed:
                    consumer.ack(message)
                unrouted = [m for m, _ in failed if all(m is not r for r in routed)]
                for message in unrouted:
                    consumer.nack(message)  # the copy failed: redeliver rather than lose it
            if on_batch is not None:
                on_batch(stats)
    finally:
        consumer.close()
        if router is not None:
            router.close()
    return stats
