"""DLQ replay: send selected dead letters back to the first retry topic or the original topic.

Resumable without a store of its own: a replay has an id, and two consumer groups of the DLQ
named after it hold its progress. Before a chunk of dead letters is replayed, the *intent*
group is committed past it; once the broker has acknowledged every copy, the *done* group is.
A replay that is killed and run again starts at the done position; dead letters between done
and intent may have been replayed already, so they are replayed again and reported as possible
duplicates (at most one chunk per partition). Running the same replay after it finished moves
only dead letters that arrived since.

This module selects the dead letters and keeps that progress; ``kmq_dagster.kafka.replay_copies``
writes the copies. ``ReplayRequest``, ``ReplayReport`` and ``target_topic`` are defined in
``kmq_dagster.core.replay_request`` and importable from here too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import Consumer, Message, TopicPartition

from kmq_dagster.audit.history import ReplayedCopy, record_replay_events
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.headers import ERROR_TYPE, header_value, normalize_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.replay import read_replay_count
from kmq_dagster.core.replay_request import ReplayReport, ReplayRequest, target_topic
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.clients import new_consumer, positions_after, wall_clock_ms
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.replay_copies import ReplayCopier
from kmq_dagster.kafka.topic_reader import read_to_end
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)

#: Dead letters replayed between two progress commits: the most a crash can duplicate.
CHUNK = 100
#: How many selected dead letters a dry run lists one by one.
DRY_RUN_LISTED = 20

__all__ = [
    "CHUNK",
    "ReplayReport",
    "ReplayRequest",
    "replay_dead_letters",
    "target_topic",
]


Progress = Callable[[ReplayReport], None]


def replay_dead_letters(
    opened: OpenedQueue,
    request: ReplayRequest,
    *,
    progress: Progress | None = None,
    clock_ms: Callable[[], int] = wall_clock_ms,
    audit: AuditStore | None = None,
    actor: str = "unknown",
    cancel: threading.Event | None = None,
) -> ReplayReport:
    """Replay the dead letters ``request`` selects; see the module docstring for resumption.

    With ``audit``, replayed dead letters are marked ``replayed`` there as they go, each gets
    a history event naming where its copy was written, and the replay (dry run or not,
    finished, cancelled or failed) is written as one action by ``actor``. Setting ``cancel``
    stops the replay after the chunk in flight (at most a second's worth under a rate limit);
    running it again resumes it.

    Raises:
        ConfigError: a bad request (unknown partition in the selection).
        DeliveryError: the broker refused copies; progress stops before them, rerun to resume.
    """
    settings, queue = opened.settings, opened.queue
    source = queue.dlq_topic
    target = target_topic(queue, request)
    partitions = opened.partitions
    unknown = sorted(p for p in request.selection.offsets if not 0 <= p < partitions)
    if unknown:
        raise ConfigError(
            f"{source} has {partitions} partitions; no partition {unknown}", setting="offsets"
        )
    report = ReplayReport(request.id_for(queue), request.target, request.dry_run)
    run = _ReplayRun(settings, queue, request, report, clock_ms=clock_ms)
    run.audit = audit
    run.actor = actor
    run.cancel = cancel
    outcome = "failed"
    try:
        run.scan(progress)
        outcome = report.summary()
    except Exception as exc:
        outcome = f"failed after {report.replayed} replayed: {exc}"
        raise
    finally:
        run.close()
        if audit is not None:
            audit.record_action(
                kind="replay",
                actor=actor,
                queue_topic=queue.topic,
                group_id=queue.group,
                selection=f"{request.selection.describe()} (replay id {report.replay_id})",
                count=report.movable if request.dry_run else report.replayed,
                target=target,
                dry_run=request.dry_run,
                outcome=outcome,
            )
    return report


def _progress_groups(replay_id: str) -> tuple[str, str]:
    done = f"kmq-replay.{replay_id}"
    return done, f"{done}.intent"


class _ReplayRun:
    def __init__(
        self,
        settings: KmqSettings,
        queue: Queue,
        request: ReplayRequest,
        report: ReplayReport,
        *,
        clock_ms: Callable[[], int],
    ) -> None:
        self.request = request
        self.selection = request.selection.resolved(clock_ms())
        self.source = queue.dlq_topic
        self.report = report
        done_group, intent_group = _progress_groups(report.replay_id)
        self.done = new_consumer(settings, done_group, **{"enable.partition.eof": True})
        self.intent = new_consumer(settings, intent_group, **{"enable.partition.eof": True})
        self.partitions = list(range(queue.partitions or 1))
        self.copier = ReplayCopier(
            settings, request, target_topic(queue, request), len(self.partitions), clock_ms=clock_ms
        )
        self.audit: AuditStore | None = None
        self.actor = "unknown"
        self.cancel: threading.Event | None = None
        # Under a rate limit, about a second of copies per chunk, so a cancel acts quickly.
        rate = request.rate_per_s
        self.chunk_size = CHUNK if rate is None else max(1, min(CHUNK, int(rate)))
        timeout_s = settings.request_timeout_ms / 1000
        done_at = self._committed(self.done, timeout_s)
        intent_at = self._committed(self.intent, timeout_s)
        if not request.dry_run:
            report.possible_duplicates = sum(
                max(0, intent_at[p] - done_at[p]) for p in self.partitions
            )
            if report.possible_duplicates:
                log.warning(
                    "replay %s was interrupted: %d dead letters may have been replayed already "
                    "and are replayed again",
                    report.replay_id,
                    report.possible_duplicates,
                )
        self.done.assign([TopicPartition(self.source, p, done_at[p]) for p in self.partitions])

    def scan(self, progress: Progress | None) -> None:
        if self._cancelled():
            return
        for chunk in read_to_end(self.done, self.partitions, timeout_s=None, batch=self.chunk_size):
            self._handle(chunk)
            if progress is not None:
                progress(self.report)
            if self._cancelled():
                return

    def _cancelled(self) -> bool:
        if self.cancel is not None and self.cancel.is_set():
            self.report.cancelled = True
        return self.report.cancelled

    def _handle(self, chunk: list[Message]) -> None:
        report, request = self.report, self.request
        report.scanned += len(chunk)
        discarded = self._discarded(chunk)
        moving: list[Message] = []
        for record in chunk:
            headers = normalize_headers(record.headers())
            partition, offset = record.partition() or 0, record.offset() or 0
            if not self.selection.matches(
                partition, offset, record.key(), headers, record.timestamp()[1]
            ):
                continue
            report.selected += 1
            if (partition, offset) in discarded:
                report.discarded += 1
                continue
            if read_replay_count(headers) >= request.max_replays:
                report.over_limit += 1
                continue
            error_type = (header_value(headers, ERROR_TYPE) or b"unknown").decode(errors="replace")
            report.by_error_type[error_type] += 1
            moving.append(record)
            if request.dry_run and len(report.listed) < DRY_RUN_LISTED:
                report.listed.append(
                    f"{self.source}[{partition}]@{offset} key={record.key()!r} {error_type}"
                )
        if request.dry_run:
            return
        positions = positions_after(chunk)
        copies: list[ReplayedCopy] = []
        if moving:
            self.intent.commit(offsets=positions, asynchronous=False)
            copies = self.copier.write(moving)
            report.replayed += len(moving)
        self.done.commit(offsets=positions, asynchronous=False)
        if moving and self.audit is not None:
            coordinates = [(r.partition() or 0, r.offset() or 0) for r in moving]
            self.audit.set_status(self.source, coordinates, "replayed")
            record_replay_events(
                self.audit, self.source, copies, actor=self.actor, replay_id=report.replay_id
            )

    def _discarded(self, chunk: list[Message]) -> set[tuple[int, int]]:
        """(partition, offset) of the chunk's dead letters an operator discarded."""
        if self.audit is None:
            return set()
        found: set[tuple[int, int]] = set()
        for position in positions_after(chunk):
            offsets = [r.offset() or 0 for r in chunk if (r.partition() or 0) == position.partition]
            statuses = self.audit.statuses(
                self.source, position.partition, min(offsets), max(offsets)
            )
            found |= {(position.partition, o) for o, s in statuses.items() if s == "discarded"}
        return found

    def _committed(self, consumer: Consumer, timeout_s: float) -> dict[int, int]:
        """Committed offset per DLQ partition (0 where nothing is committed)."""
        found = consumer.committed(
            [TopicPartition(self.source, p) for p in self.partitions], timeout=timeout_s
        )
        return {tp.partition: max(tp.offset, 0) for tp in found}

    def close(self) -> None:
        self.copier.close()
        self.done.close()
        self.intent.close()
