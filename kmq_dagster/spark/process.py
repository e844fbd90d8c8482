"""Calling the user's function over a chunk of messages, and the output rows of its successes.

Per message this runs the function and nothing else in Python: the messages are built column
by column (:func:`~kmq_dagster.spark.message.spark_messages`), output columns come from the
records in C-level passes, and the coordinates where a message was first produced are read from
headers only for messages that have headers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import Any

from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.kafka.message import origin_coordinates
from kmq_dagster.kafka.record_columns import RecordColumns
from kmq_dagster.spark.message import SparkMessage
from kmq_dagster.tracing import tracing_active
from kmq_dagster.worker.handler_call import HandlerCall

Function = Callable[[SparkMessage], object]
#: Checks a retried copy's ``kmq-*`` headers; a reason to dead-letter it, or ``None``.
MetadataCheck = Callable[[SparkMessage], "str | None"]

_NULL = "null"


#: Longest a run of messages between two looks at the clock should take, in seconds.
STEP_S = 0.005
#: Most messages between two looks at the clock.
MAX_STEP = 1_024

#: Stands in for the result of a message whose function raised.
FAILED = object()


@dataclass
class Outcome:
    """What became of the first ``done`` messages of a chunk."""

    #: The function's return value per message done, in order; ``FAILED`` where it failed.
    results: list[object] = field(default_factory=list)
    #: Failed messages with why: an exception's Failure, or a reason to dead-letter at once.
    failed: list[tuple[SparkMessage, Failure | str]] = field(default_factory=list)

    @property
    def done(self) -> int:
        return len(self.results)

    def succeeded(self) -> list[bool]:
        return [result is not FAILED for result in self.results]


def call_function(
    function: Function | HandlerCall,
    messages: list[SparkMessage],
    stop_at: float,
    check: MetadataCheck | None = None,
    clock: Callable[[], float] = time.monotonic,
    *,
    group: str | None = None,
) -> Outcome:
    """Run ``function`` on ``messages`` in order, until ``clock()`` passes ``stop_at`` (at
    least one message is always done). Each call goes through the worker's
    :class:`~kmq_dagster.worker.handler_call.HandlerCall` (pass one to keep its event loop
    between chunks): an awaitable it returns is awaited and a generator fails its message.
    With ``check``, a message whose retry metadata is unreadable fails without being passed to
    the function. With tracing on, each call is a ``process`` span of ``group`` (of the
    ``HandlerCall``'s group when one is given)."""
    call = function if isinstance(function, HandlerCall) else HandlerCall(function, group=group)
    outcome = Outcome()
    start, step = 0, 1
    try:
        while start < len(messages):
            # The clock is read between steps, not per message: a step grows while it takes
            # under STEP_S, so a slow function still stops close to ``stop_at``.
            began = clock()
            _call_each(call, messages[start : start + step], outcome, check)
            start += step
            now = clock()
            if now > stop_at:
                break
            if now - began < STEP_S:
                step = min(2 * step, MAX_STEP)
    finally:
        if call is not function:
            call.close()
    return outcome


def _call_each(
    call: HandlerCall,
    messages: list[SparkMessage],
    outcome: Outcome,
    check: MetadataCheck | None,
) -> None:
    from kmq_dagster.kafka.retry_router import failure_of

    append, failed = outcome.results.append, outcome.failed
    # Tracing is looked up once per step, not per message: the loop is hot. Untraced, the
    # function is called here and only a result that is not None goes through HandlerCall.
    traced, function, settle = tracing_active(), call.handler, call.settle
    for message in messages:
        problem = check(message) if check is not None else None
        if problem is not None:
            append(FAILED)
            failed.append((message, problem))
            continue
        try:
            if traced:
                append(call(message))
            elif (result := function(message)) is None:
                append(None)
            else:
                append(settle(result))
        except Exception as exc:
            append(FAILED)
            failed.append((message, failure_of(exc)))


def output_columns(
    messages: list[SparkMessage], outcome: Outcome, columns: RecordColumns, batch_id: str
) -> list[Any]:
    """Output columns (``OUTPUT_COLUMNS``) of the chunk's successes, from its record columns."""
    done = outcome.done
    offsets, keys, raw_headers = (
        columns.offsets[:done],
        columns.keys[:done],
        columns.raw_headers[:done],
    )
    results: list[Any] = outcome.results
    if outcome.failed:
        kept = outcome.succeeded()
        messages = list(compress(messages[:done], kept))
        offsets, keys, raw_headers = (list(compress(c, kept)) for c in (offsets, keys, raw_headers))
        results = list(compress(results, kept))
    count = len(offsets)
    first = messages[0] if messages else None
    if first is None or not any(raw_headers):
        # No headers, so no origin elsewhere: each message was first produced where it is.
        topics: Any = repeat(first.topic if first else "", count)
        partitions: Any = repeat(first.partition if first else 0, count)
    else:
        origins = [origin_coordinates(message) for message in messages[:count]]
        topics = [topic for topic, _, _ in origins]
        partitions = [partition for _, partition, _ in origins]
        offsets = [offset for _, _, offset in origins]
    return [
        topics,
        partitions,
        offsets,
        keys,
        [_NULL if result is None else as_json(result) for result in results],
        repeat(batch_id, count),
    ]


def as_json(result: object) -> str:
    """A function's return value as JSON text (bytes as UTF-8; anything else as its ``str``)."""
    if isinstance(result, bytes):
        result = result.decode("utf-8", errors="replace")
    try:
        return json.dumps(result)
    except TypeError:
        return json.dumps(str(result))


def message_rows(messages: list[SparkMessage]) -> list[Any]:
    """Input columns (``INPUT_COLUMNS``) of ``messages``, for a DataFrame transform."""
    origins = [origin_coordinates(message) for message in messages]
    return [
        [topic for topic, _, _ in origins],
        [partition for _, partition, _ in origins],
        [offset for _, _, offset in origins],
        [m.key for m in messages],
        [m.value for m in messages],
        [m.timestamp_ms for m in messages],
        [[{"name": n, "value": v} for n, v in m.headers] for m in messages],
    ]
