"""Step 4 of the protocol (docs/design.md): acknowledgements become end markers, one per
contiguous run of offsets.

``KmqConsumer.ack`` only appends to :attr:`AckFlusher.acks`, from any thread and in any order;
a flush turns what was appended into end markers. The consumer's poll flushes, and a
background thread flushes when nobody polls, so the acks of a long-running handler do not
wait for the next poll and miss their deadline.

A poll that does not wait flushes only if the last flush is ``ACK_FLUSH_GAP_S`` old: a
worker whose calls end one or two at a time polls between every two of them, and one end
marker (a produce, and serving the producer) per message, with a ``sleep(0)`` in each such
poll, held a no-op handler at concurrency 2 to 7.5k msg/s quiet and 4-7k loaded (13-15k and
34-47k without both: docs/benchmarks.md, stop 49). The gap is the background thread's
interval, 50 ms. Calls that end out of order (``key``, ``unordered``) leave gaps in each
flush's offsets, and every gap starts another end marker: at 1 ms almost every message had
its own (stop 50); at 20 ms Parallel Consumer's shape still wrote 3,700-5,500 end markers for
its 10,000 messages in key order and 930-1,400 unordered, at 50 ms 2,000-2,900 and 460-670,
and drained 5-10% faster (each marker's delivery report takes the GIL from the handler
threads; stop 67). So acknowledgements wait at most that long for their end marker whoever
writes it, small beside a visibility timeout of seconds; a poll that is about to wait writes
them first.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable
from itertools import repeat

from confluent_kafka import Message

from kmq_dagster.core.handouts import HandoutLedger
from kmq_dagster.kafka.consumer_stats import ConsumerStats
from kmq_dagster.kafka.marker_writer import MarkerWriter
from kmq_dagster.kafka.message import KmqMessage, record_of
from kmq_dagster.kafka.runs import record_runs

# The consumer's log: an operator reads the consumer's lines under one logger name.
log = logging.getLogger("kmq_dagster.kafka.consumer")
#: A view's record, read in C (``KmqMessage.record`` is a slot).
_record_of_view = operator.attrgetter("record")

#: How often acknowledgements are turned into end markers when nobody polls.
ACK_FLUSH_INTERVAL_S = 0.05
#: A poll that will not wait writes acknowledgements once the last flush is this old.
ACK_FLUSH_GAP_S = ACK_FLUSH_INTERVAL_S


class AckFlusher:
    """Writes the end markers of the acknowledgements appended to :attr:`acks`.

    Starts its background thread at once; :meth:`stop` ends it.

    Args:
        handouts: what the consumer handed out, to find each acknowledged message's run.
        thread_name: the name of the background thread.
        clock_s: monotonic seconds (tests give a fake one).
    """

    def __init__(
        self,
        markers: MarkerWriter,
        handouts: HandoutLedger[KmqMessage | Message],
        stats: ConsumerStats,
        *,
        thread_name: str,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        # Acks from any thread need no lock: list.append is atomic, and the drain (one at a
        # time) copies and deletes a prefix, so acks appended meanwhile stay for the next one.
        self.acks: list[KmqMessage | Message] = []
        self._markers = markers
        self._handouts = handouts
        self._stats = stats
        self._clock_s = clock_s
        self._last_flush = clock_s()
        self._drain_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._flush_periodically, name=thread_name, daemon=True
        )
        self._thread.start()

    def flush_before_poll(self, *, waiting: bool, serve: bool = True) -> None:
        """:meth:`flush` for a poll: always if it is ``waiting`` for messages, else only once
        the last flush is ``ACK_FLUSH_GAP_S`` old (the next poll comes soon)."""
        if self.acks and (waiting or self._clock_s() - self._last_flush >= ACK_FLUSH_GAP_S):
            self.flush(serve=serve)

    def flush(self, *, serve: bool = True) -> None:
        """4. Turn acknowledgements into end markers, one per contiguous run; with ``serve``,
        serve the producer's delivery reports too (a poll that serves them itself soon after
        passes ``False``)."""
        self._last_flush = self._clock_s()
        acks = self.acks
        # poll() and the background thread both flush: one drains at a time. Acks appended
        # meanwhile wait for the next flush.
        with self._drain_lock:
            count = len(acks)
            acked = acks[:count]
            del acks[:count]
        if not acked:
            return
        matched = self._handouts.match(acked)
        runs = matched.runs
        if matched.leftovers:
            runs = runs + record_runs(self._records_of(matched.leftovers))
        self._markers.end(runs)
        if serve:
            self._markers.serve()
        self._stats.acked += sum(count for _, _, count in runs)
        self._stats.end_markers += len(runs)

    def stop(self) -> None:
        """End the background thread (waits up to 5 s); acks left are for :meth:`flush`."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _records_of(self, acked: list[KmqMessage | Message]) -> list[Message]:
        """The records of acknowledged messages; anything else is reported and skipped."""
        if all(map(isinstance, acked, repeat(KmqMessage))):  # the common case: C-speed passes
            return list(map(_record_of_view, acked))
        records: list[Message] = []
        for item in acked:
            try:
                records.append(record_of(item))
            except TypeError:
                self._stats.invalid_acks += 1
                log.error("ack() got %r, not a message from this consumer; ignored", item)
        return records

    def _flush_periodically(self) -> None:
        # poll() flushes acks itself; this thread covers handlers that run long between polls
        # (acks from other threads must not wait for the next poll and miss their deadline).
        while not self._stop.wait(ACK_FLUSH_INTERVAL_S):
            if self._clock_s() - self._last_flush < ACK_FLUSH_INTERVAL_S:
                continue
            try:
                self.flush()
            except Exception:  # the flusher must survive: a lost end marker only redelivers
                log.exception("writing end markers failed; will retry")
