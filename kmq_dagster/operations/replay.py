"""DLQ replay: send selected dead letters back to the group (its redelivery topic) or to the
original topic.

A copy back to the group goes to its redelivery topic rather than a retry topic, so that the
breaker and the failure counts, which read a retry topic's growth as handler failures, never
count an operator's replay as one (invariant 12, ``core.replay_request.target_topic``).

Resumable without a store of its own: a replay has an id, and two consumer groups of the DLQ
named after it hold its progress. Before a chunk of dead letters is replayed, the *intent*
group is committed past it; once the broker has acknowledged every copy, the *done* group is.
A replay that is killed and run again starts at the done position; dead letters between done
and intent may have been replayed already, so they are replayed again and reported as possible
duplicates (at most one chunk per partition). Running the same replay after it finished moves
only dead letters that arrived since.

This module selects the dead letters and keeps that progress;
``kmq_dagster.operations.replay_copies``
writes the copies. ``ReplayRequest``, ``ReplayReport`` and ``target_topic`` are defined in
``kmq_dagster.core.replay_request`` and importable from here too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import NoReturn

from confluent_kafka import Consumer, Message, TopicPartition

from kmq_dagster.audit.actions import (
    FAILED,
    INTERRUPTED,
    STOPPED,
    SUCCEEDED,
    ActionRecord,
    start_action,
    uses_of_replay_id,
)
from kmq_dagster.audit.models import Action, as_utc
from kmq_dagster.audit.replay_log import (
    SENT,
    UNCONFIRMED,
    ChunkRecords,
    chunk_records,
    confirm_copies,
    record_intents,
)
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.dead_letter_formats import EACH_ORIGINAL_TOPIC, format_of, reading_headers
from kmq_dagster.core.headers import ERROR_TYPE, ORIGINAL_TOPIC, header_value, normalize_headers
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.replay import read_replay_count
from kmq_dagster.core.replay_request import (
    ReplayReport,
    ReplayRequest,
    StopRequest,
    stop_reason,
    target_topic,
)
from kmq_dagster.errors import AuditStoreError, ConfigError
from kmq_dagster.kafka.clients import new_consumer, positions_after, wall_clock_ms
from kmq_dagster.kafka.group_offsets import read_committed
from kmq_dagster.kafka.opened_queue import OpenedQueue
from kmq_dagster.kafka.reference_resolver import ReferenceResolver
from kmq_dagster.kafka.topic_reader import read_to_end
from kmq_dagster.operations.replay_copies import ReplayCopier
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
    "StopRequest",
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
    on_wait: Callable[[Action], None] | None = None,
) -> ReplayReport:
    """Replay the dead letters ``request`` selects; see the module docstring for resumption.

    With ``audit`` (invariant 8, docs/design.md "Audit before effect"): the replay is written
    as a running action by ``actor`` before anything is sent, waits while another action on
    this queue's dead letters runs (``on_wait`` is told which), records each chunk's copies
    before producing them and confirms them with the dead letters marked ``replayed`` once the
    broker has them, skips dead letters this replay already copied, and counts the replay
    limit per dead letter across every replay recorded there; the action is finished with its
    counts however the replay ends. Setting ``cancel`` (a :class:`StopRequest` names why)
    stops the replay after the chunk in flight (at most a second's worth under a rate limit);
    running it again resumes it.

    Raises:
        ConfigError: a bad request (unknown partition in the selection).
        ReferenceUnresolvedError: a selected dead letter stands for a message too large to
            copy, and that message can no longer be read (nothing of its chunk was sent).
        DeliveryError: the broker refused copies; progress stops before them, rerun to resume.
        AuditStoreError: the store refused a write; the message says what was left unconfirmed.
    """
    settings, queue = opened.settings, opened.queue
    source = queue.dlq_topic
    target = target_topic(queue, request)
    partitions = opened.dlq_partitions
    unknown = sorted(p for p in request.selection.offsets if not 0 <= p < partitions)
    if unknown:
        raise ConfigError(
            f"{source} has {partitions} partitions; no partition {unknown}", setting="offsets"
        )
    report = ReplayReport(
        request.id_for(queue), request.target, request.dry_run, to_topic=request.to_topic
    )
    selection = f"{request.selection.describe()} (replay id {report.replay_id})"
    action = None
    if audit is not None:
        _refuse_reused_id(audit, queue, report.replay_id, selection, target)
        action = start_action(
            audit, kind="replay", actor=actor, queue_topic=queue.topic, group_id=queue.group,
            selection=selection,
            target=target, dry_run=request.dry_run,
        )  # fmt: skip
    run: _ReplayRun | None = None
    try:
        if action is not None and not request.dry_run:
            report.cancelled = not action.acquire(cancel, on_wait)
            before = action.previous_run()  # read once the lease's look found it dead
            if before is not None and before.state == INTERRUPTED:
                report.interrupted_before = (
                    f"action #{before.id} by {before.actor}: {before.outcome}"
                )
        if not report.cancelled:  # progress is read once the lease is held
            run = _ReplayRun(
                settings, queue, request, report, clock_ms=clock_ms,
                audit=audit, action=action, actor=actor, cancel=cancel,
            )  # fmt: skip
            run.scan(progress)
    except BaseException as exc:
        if action is None:
            raise
        _end_failed(action, report, exc, run)
    finally:
        if run is not None:
            run.close()
    if action is not None:
        outcome, reason = report.summary(), stop_reason(cancel)
        if report.cancelled and reason != "cancelled":
            outcome = f"stopped ({reason}): " + outcome.removeprefix("cancelled: ")
        try:
            action.finish(
                STOPPED if report.cancelled else SUCCEEDED,
                report.movable if request.dry_run else report.replayed,
                outcome,
            )
        except AuditStoreError as exc:
            raise AuditStoreError(
                f"{exc}; the replay itself ended ({outcome}); its action (#{action.id}) reads "
                "interrupted once this process has exited, with every copy confirmed"
            ) from None
    return report


def _refuse_reused_id(
    audit: AuditStore, queue: Queue, replay_id: str, selection: str, target: str
) -> None:
    """A replay id names one replay: its selection as given (relative times as worded, e.g.
    ``since 2h ago``) and its target. Under another selection or target the id's progress
    would skip what the first use already passed, and the replay would quietly move nothing.

    Raises:
        ConfigError: ``replay_id`` was used on this queue's group for another selection or
            target; the message names that first use.
    """
    for earlier in uses_of_replay_id(
        audit, queue_topic=queue.topic, group_id=queue.group, replay_id=replay_id
    ):
        # Only where the copies went, original topic or back to the group, is compared: the
        # group's topic is named by what that target wrote to when the action ran.
        if earlier.selection == selection and (earlier.target == queue.topic) == (
            target == queue.topic
        ):
            continue
        first = earlier.selection.removesuffix(f" (replay id {replay_id})")
        went = "the original topic" if earlier.target == queue.topic else "this group"
        raise ConfigError(
            f"replay id {replay_id} is taken: action #{earlier.id} by {earlier.actor} at "
            f"{as_utc(earlier.at):%Y-%m-%d %H:%M:%S} UTC replayed {first} to {went} under it; "
            "run that same selection and target again to resume it, or give this selection "
            "another replay id",
            setting="replay_id",
        )


def _end_failed(
    action: ActionRecord, report: ReplayReport, exc: BaseException, run: _ReplayRun | None
) -> NoReturn:
    """Finish ``action`` as failed (or stopped, for Ctrl-C and exits) and raise, saying what
    the operator must know about copies the store could not confirm."""
    stopped = not isinstance(exc, Exception)
    unconfirmed = run.unconfirmed if run is not None else 0
    left = (
        f"; {unconfirmed} copies of the last chunk may have been sent: they are recorded as "
        "unconfirmed, and running the same replay again sends them again (counted as possible "
        "duplicates)"
        if unconfirmed
        else ""
    )
    note = action.fail(
        f"{'stopped' if stopped else 'failed'} after {report.replayed} replayed: "
        f"{exc or type(exc).__name__}{left}",
        count=report.replayed,
        state=STOPPED if stopped else FAILED,
    )
    if isinstance(exc, AuditStoreError):
        raise AuditStoreError(
            f"{exc}; the replay stopped after {report.replayed} confirmed copies{left}{note}; "
            "once the store takes writes again, run the same replay again to resume"
        ) from None
    raise exc


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
        audit: AuditStore | None = None,
        action: ActionRecord | None = None,
        actor: str = "unknown",
        cancel: threading.Event | None = None,
    ) -> None:
        self.request = request
        self.selection = request.selection.resolved(clock_ms())
        self.source = queue.dlq_topic
        self.dead_letter_format = format_of(queue)
        self.target = target_topic(queue, request)
        self.report = report
        self.audit, self.action, self.actor, self.cancel = audit, action, actor, cancel
        #: Copies of the chunk in flight recorded as about to be sent, not yet confirmed.
        self.unconfirmed = 0
        done_group, intent_group = _progress_groups(report.replay_id)
        self.done = new_consumer(settings, done_group, **{"enable.partition.eof": True})
        self.intent = new_consumer(settings, intent_group, **{"enable.partition.eof": True})
        self.partitions = list(range(queue.dlq_partitions))
        self.copier = ReplayCopier(
            settings, request, self.target, queue.partitions or 1, clock_ms=clock_ms,
            dead_letter_format=self.dead_letter_format,
        )  # fmt: skip
        self.references = ReferenceResolver(settings, queue)
        # Under a rate limit, about a second of copies per chunk, so a cancel acts quickly.
        rate = request.rate_per_s
        self.chunk_size = CHUNK if rate is None else max(1, min(CHUNK, int(rate)))
        timeout_s = settings.request_timeout_ms / 1000
        done_at = self._committed(self.done, timeout_s)
        intent_at = self._committed(self.intent, timeout_s)
        if not request.dry_run and audit is None:
            # Without a store, every dead letter between done and intent counts; with one,
            # exactly those whose copies were never confirmed do (see _handle).
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
        known = self._records(chunk)
        moving: list[Message] = []
        earlier: dict[tuple[int, int], int] = {}
        for record in chunk:
            # Read in the DLQ's format (the copy carries the record's own headers).
            headers = reading_headers(self.dead_letter_format, normalize_headers(record.headers()))
            at = partition, offset = record.partition() or 0, record.offset() or 0
            if not self.selection.matches(
                partition, offset, record.key(), headers, record.timestamp()[1]
            ):
                continue
            report.selected += 1
            if at in known.discarded:
                report.discarded += 1
                continue
            if self.target == EACH_ORIGINAL_TOPIC and not header_value(headers, ORIGINAL_TOPIC):
                report.no_original_topic += 1  # left in the DLQ: never lost, never guessed
                continue
            mine = known.state(at, report.replay_id)
            if mine == SENT:  # a confirmed copy: never sent twice by one replay
                report.already_replayed += 1
                continue
            # The limit counts every replay recorded against this dead letter, however its
            # selection was worded, on top of the replays its header counts.
            earlier[at] = len(known.replay_ids(at) - {report.replay_id})
            if read_replay_count(headers) + earlier[at] >= request.max_replays:
                report.over_limit += 1
                continue
            # A copy recorded unconfirmed may be on the topic: sending the dead letter again,
            # under this replay's id or another's (the console's next filter resolves to
            # another id), may duplicate it.
            if (mine == UNCONFIRMED or known.left_unconfirmed(at)) and not request.dry_run:
                report.possible_duplicates += 1
            error_type = (header_value(headers, ERROR_TYPE) or b"unknown").decode(errors="replace")
            report.by_error_type[error_type] += 1
            moving.append(record)
            if request.dry_run and len(report.listed) < DRY_RUN_LISTED:
                report.listed.append(
                    f"{self.source}[{partition}]@{offset} key={record.key()!r} {error_type}"
                )
        if request.dry_run:
            return
        # Before any effect: a reference that cannot be resolved stops the replay here.
        values = self.references.values(moving)
        self.copier.refuse_oversize(moving, values)
        positions = positions_after(chunk)
        if moving:
            self.intent.commit(offsets=positions, asynchronous=False)
            self._send(moving, earlier, values)
        self.done.commit(offsets=positions, asynchronous=False)

    def _send(
        self,
        moving: list[Message],
        earlier: dict[tuple[int, int], int],
        values: dict[tuple[int, int], bytes | None],
    ) -> None:
        """Record the copies as about to be sent, send them, confirm them (docs/design.md)."""
        report, audit, action = self.report, self.audit, self.action
        coordinates = [(r.partition() or 0, r.offset() or 0) for r in moving]
        if audit is not None and action is not None:
            record_intents(
                audit, action, self.source, coordinates,
                actor=self.actor, replay_id=report.replay_id,
            )  # fmt: skip
            self.unconfirmed = len(moving)
        copies = self.copier.write(moving, earlier, values)
        if audit is not None and action is not None:
            replayed = report.replayed + len(moving)
            confirm_copies(
                audit, action, self.source, copies,
                replayed=replayed, progress=f"running: replayed {replayed} so far",
            )  # fmt: skip
            self.unconfirmed = 0
        report.replayed += len(moving)

    def _records(self, chunk: list[Message]) -> ChunkRecords:
        """What the audit store knows of the chunk's dead letters (nothing without one)."""
        if self.audit is None:
            return ChunkRecords()
        offsets: dict[int, list[int]] = {}
        for record in chunk:
            offsets.setdefault(record.partition() or 0, []).append(record.offset() or 0)
        return chunk_records(self.audit, self.source, offsets)

    def _committed(self, consumer: Consumer, timeout_s: float) -> dict[int, int]:
        """Committed offset per DLQ partition (0 where nothing is committed).

        Raises:
            KafkaUnavailableError: the progress could not be read (never guessed as 0).
        """
        found = read_committed(consumer, [(self.source, p) for p in self.partitions], timeout_s)
        return {partition: offset or 0 for (_, partition), offset in found.items()}

    def close(self) -> None:
        self.copier.close()
        self.references.close()
        self.done.close()
        self.intent.close()
