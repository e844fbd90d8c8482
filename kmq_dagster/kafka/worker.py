"""The worker loop behind ``kmq worker``: a handler per message, an ack when it returns."""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.consumer import KmqConsumer, KmqMessage

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
) -> WorkerStats:
    """Handle messages until ``stop`` is set: return acknowledges, raising asks for redelivery.

    ``KeyboardInterrupt`` and ``SystemExit`` in a handler stop the worker; the message they
    interrupted is neither acknowledged nor lost: its visibility timeout redelivers it.
    """
    stats = WorkerStats()
    try:
        while not stop.is_set():
            for message in consumer.poll(timeout_s=0.5):
                if stop.is_set():
                    break  # not acknowledged: redelivered after its visibility timeout
                try:
                    handler(message)
                except Exception as exc:
                    stats.failed += 1
                    log.info(
                        "handler failed on %s[%d]@%d: %s: %s",
                        message.topic,
                        message.partition,
                        message.offset,
                        type(exc).__name__,
                        exc,
                    )
                    consumer.nack(message)
                else:
                    consumer.ack(message)
                    stats.handled += 1
            if on_batch is not None:
                on_batch(stats)
    finally:
        consumer.close()
    return stats
