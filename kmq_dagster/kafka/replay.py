"""DLQ replay: send selected dead letters back to the first retry topic or the original topic.

Resumable without a store of its own: a replay has an id, and two consumer groups of the DLQ
named after it hold its progress. Before a chunk of dead letters is replayed, the *intent*
group is committed past it; once the broker has acknowledged every copy, the *done* group is.
A replay that is killed and run again starts at the done position; dead letters between done
and intent may have been replayed already, so they are replayed again and reported as possible
duplicates (at most one chunk per partition). Running the same replay after it finished moves
only dead letters that arrived since.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from kmq_dagster.audit.history import ReplayedCopy, record_replay_events
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.headers import (
    ERROR_TYPE,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    header_value,
    normalize_headers,
    replace_headers,
)
from kmq_dagster.core.naming import dlq_topic, retry_topic
from kmq_dagster.core.replay import (
    DEFAULT_MAX_REPLAYS,
    TARGETS,
    TO_RETRY,
    ReplaySelection,
    default_replay_id,
    read_replay_count,
    replay_headers,
)
from kmq_dagster.errors import BrokerError, ConfigError
from kmq_dagster.kafka.clients import (
    CLIENT_LOGGER,
    commit_offsets,
    positions_after,
    wall_clock_ms,
)
from kmq_dagster.kafka.provision import require_topics
from kmq_dagster.kafka.topic_reader import records_and_ends
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)

#: Dead letters replayed between two progress commits: the most a crash can duplicate.
CHUNK = 100
#: How many selected dead letters a dry run lists one by one.
DRY_RUN_LISTED = 20


@dataclass(frozen=True)
class ReplayRequest:
    """One replay: what to move, where, how fast."""

    topic: str
    group: str
    selection: ReplaySelection = field(default_factory=ReplaySelection)
    target: str = TO_RETRY
    dry_run: bool = False
    #: Copies per second at most; ``None``: as fast as the broker takes them.
    rate_per_s: float | None = None
    max_replays: int = DEFAULT_MAX_REPLAYS
    replay_id: str | None = None
    #: The group's retry delays; the first one names the retry topic.
    retry_delays_ms: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError(f"replay target must be one of {', '.join(TARGETS)}")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ConfigError("--rate must be positive")
        if self.max_replays < 1:
            raise ConfigError("--max-replays must be at least 1")

    @property
    def id(self) -> str:
        return self.replay_id or default_replay_id(
            self.topic, self.group, self.selection, self.target
        )


@dataclass
class ReplayReport:
    """What a replay found and did."""

    replay_id: str
    target: str
    dry_run: bool
    scanned: int = 0
    selected: int = 0
    replayed: int = 0
    #: Selected but already replayed ``max_replays`` times.
    over_limit: int = 0
    #: Selected but discarded by an operator in the audit store.
    discarded: int = 0
    #: Dead letters a killed earlier run may have replayed already, replayed again now.
    possible_duplicates: int = 0
    by_error_type: Counter[str] = field(default_factory=Counter)
    #: In a dry run: the first selected dead letters, one line each.
    listed: list[str] = field(default_factory=list)
    #: Stopped by its ``cancel`` event before reaching the end of the DLQ.
    cancelled: bool = False

    @property
    def movable(self) -> int:
        """Selected dead letters that are neither at the replay limit nor discarded."""
        return self.selected - self.over_limit - self.discarded

    def summary(self) -> str:
        verb = "would replay" if self.dry_run else "replayed"
        count = self.movable if self.dry_run else self.replayed
        types = ", ".join(f"{name} {n}" for name, n in self.by_error_type.most_common())
        return (
            ("cancelled: " if self.cancelled else "")
            + f"{verb} {count} of {self.scanned} dead letters to the {self.target} topic "
            f"(replay id {self.replay_id}); selected {self.selected}, skipped at the replay "
            f"limit {self.over_limit}, discarded {self.discarded}, "
            f"possible duplicates {self.possible_duplicates}"
            + (f"; by error type: {types}" if types else "")
        )


Progress = Callable[[ReplayReport], None]


def replay_dead_letters(
    settings: KmqSettings,
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
        ConfigError: a bad request (unknown partition in the selection, no retry delays).
        ProvisionError: the DLQ or the target topic is missing.
        BrokerError: the broker refused copies; progress stops before them, rerun to resume.
    """
    source = dlq_topic(request.topic, request.group)
    target = target_topic(request)
    partitions = require_topics(
        settings,
        request.topic,
        [source, target],
        options=f" --group {request.group}",
        note=" (or give replay the group's --retry-delays)" if request.target == TO_RETRY else "",
    )
    unknown = sorted(p for p in request.selection.offsets if not 0 <= p < partitions)
    if unknown:
        raise ConfigError(f"{source} has {partitions} partitions; no partition {unknown}")
    report = ReplayReport(request.id, request.target, request.dry_run)
    run = _ReplayRun(settings, request, report, partitions=partitions, clock_ms=clock_ms)
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
                queue_topic=request.topic,
                group_id=request.group,
                selection=f"{request.selection.describe()} (replay id {request.id})",
                count=report.movable if request.dry_run else report.replayed,
                target=target,
                dry_run=request.dry_run,
                outcome=outcome,
            )
    return report


def target_topic(request: ReplayRequest) -> str:
    """The topic a replay writes to."""
    if request.target != TO_RETRY:
        return request.topic
    if not request.retry_delays_ms:
        raise ConfigError("replaying to the retry topic needs the group's retry delays")
    return retry_topic(request.topic, request.group, request.retry_delays_ms[0])


def _progress_groups(replay_id: str) -> tuple[str, str]:
    done = f"kmq-replay.{replay_id}"
    return done, f"{done}.intent"


class _ReplayRun:
    def __init__(
        self,
        settings: KmqSettings,
        request: ReplayRequest,
        report: ReplayReport,
        *,
        partitions: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self.request = request
        self.source = dlq_topic(request.topic, request.group)
        self.target = target_topic(request)
        self.report = report
        self.clock_ms = clock_ms
        done_group, intent_group = _progress_groups(request.id)
        config = {"enable.partition.eof": True, "logger": CLIENT_LOGGER}
        self.done = Consumer(settings.consumer_config(done_group, **config))
        self.intent = Consumer(settings.consumer_config(intent_group, **config))
        self.producer = Producer(settings.producer_config(logger=CLIENT_LOGGER))
        self.partitions = list(range(partitions))
        self.audit: AuditStore | None = None
        self.actor = "unknown"
        self.cancel: threading.Event | None = None
        # Under a rate limit, about a second of copies per chunk, so a cancel acts quickly.
        rate = request.rate_per_s
        self.chunk_size = CHUNK if rate is None else max(1, min(CHUNK, int(rate)))
        self._sent = 0
        self._started = time.monotonic()
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
                    request.id,
                    report.possible_duplicates,
                )
        self.done.assign([TopicPartition(self.source, p, done_at[p]) for p in self.partitions])

    def scan(self, progress: Progress | None) -> None:
        at_end: set[int] = set()
        while len(at_end) < len(self.partitions):
            if self.cancel is not None and self.cancel.is_set():
                self.report.cancelled = True
                return
            chunk = records_and_ends(self.done.consume(self.chunk_size, 1.0), at_end)
            if chunk:
                self._handle(chunk)
                if progress is not None:
                    progress(self.report)

    def _handle(self, chunk: list[Message]) -> None:
        report, request = self.report, self.request
        report.scanned += len(chunk)
        discarded = self._discarded(chunk)
        moving: list[Message] = []
        for record in chunk:
            headers = normalize_headers(record.headers())
            partition, offset = record.partition() or 0, record.offset() or 0
            if not request.selection.matches(
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
            commit_offsets(self.intent, positions, wait=True)
            copies = self._produce(moving)
        commit_offsets(self.done, positions, wait=True)
        if moving and self.audit is not None:
            coordinates = [(r.partition() or 0, r.offset() or 0) for r in moving]
            self.audit.set_status(self.source, coordinates, "replayed")
            record_replay_events(
                self.audit, self.source, copies, actor=self.actor, replay_id=request.id
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

    def _produce(self, records: list[Message]) -> list[ReplayedCopy]:
        """Write copies of ``records`` and wait for the broker; returns where each went."""
        failures: list[KafkaError] = []
        copies: list[ReplayedCopy] = []

        def on_delivery(error: KafkaError | None, copy: Message, source: tuple[int, int]) -> None:
            if error is not None:
                failures.append(error)
            else:
                topic, partition, offset = copy.topic() or "", copy.partition(), copy.offset()
                copies.append(ReplayedCopy(*source, topic, partition or 0, offset or 0))

        for record in records:
            self._wait_for_rate()
            headers = normalize_headers(record.headers())
            plan = replay_headers(self.request.target, read_replay_count(headers), self.clock_ms())
            kept = [(k, v) for k, v in headers if k not in plan.drop]
            self.producer.produce(
                self.target,
                key=record.key(),
                value=record.value(),
                headers=[*replace_headers(kept, plan.updates)],
                partition=self._target_partition(record, headers),
                on_delivery=functools.partial(
                    on_delivery, source=(record.partition() or 0, record.offset() or 0)
                ),
            )
            self.producer.poll(0)
            self._sent += 1
        remaining = self.producer.flush(30)
        if failures or remaining:
            first = failures[0].str() if failures else "no answer within 30 s"
            raise BrokerError(
                f"{len(failures) + remaining} replayed copies were not written ({first}); "
                "nothing after them was marked done: run the same replay again to resume"
            )
        self.report.replayed += len(records)
        return copies

    def _target_partition(self, record: Message, headers: list[tuple[str, bytes | None]]) -> int:
        """The DLQ partition for a retry topic (same partition count); the original partition
        when going back to the queue topic, so a key keeps its partition."""
        if self.request.target == TO_RETRY:
            return record.partition() or 0
        original_topic = header_value(headers, ORIGINAL_TOPIC)
        original = header_value(headers, ORIGINAL_PARTITION)
        if original_topic == self.target.encode() and original and original.isdigit():
            partition = int(original)
            if partition < len(self.partitions):
                return partition
        return record.partition() or 0

    def _wait_for_rate(self) -> None:
        rate = self.request.rate_per_s
        if rate is None:
            return
        ahead_s = self._sent / rate - (time.monotonic() - self._started)
        if ahead_s > 0:
            self.producer.poll(0)
            time.sleep(ahead_s)

    def _committed(self, consumer: Consumer, timeout_s: float) -> dict[int, int]:
        """Committed offset per DLQ partition (0 where nothing is committed)."""
        found = consumer.committed(
            [TopicPartition(self.source, p) for p in self.partitions], timeout=timeout_s
        )
        return {tp.partition: max(tp.offset, 0) for tp in found}

    def close(self) -> None:
        self.producer.flush(30)
        self.done.close()
        self.intent.close()
