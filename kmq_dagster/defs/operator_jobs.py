"""Operator jobs of a queue with typed config: replay, discard and ingest dead letters. Each
launches with no config (replay and discard then do a dry run of every dead letter) and writes
its audit rows. The actor is the run's ``kmq/actor`` tag, else ``dagster/user`` (set by
Dagster+), else ``dagster run <id>``.

No ``from __future__ import annotations`` here: Dagster reads op signatures at run time.
"""

from datetime import UTC, datetime

from dagster import (
    AssetObservation,
    Config,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    op,
)
from pydantic import Field

from kmq_dagster.audit.store import DeadLetterFilter
from kmq_dagster.core.replay import ReplaySelection, parse_offsets, parse_time, resolve_time
from kmq_dagster.core.wording import counted
from kmq_dagster.defs.queue_spec import QueueSpec, queue_job
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.kafka.foreign_dlq import open_foreign_dlq
from kmq_dagster.operations.audited_ingest import run_ingest
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.operations.replay import ReplayRequest, replay_dead_letters

ACTOR_TAG = "kmq/actor"


def actor_of(context: OpExecutionContext) -> str:
    """Who launched the run: its ``kmq/actor`` or ``dagster/user`` tag, else the run."""
    tags = context.run.tags
    return tags.get(ACTOR_TAG) or tags.get("dagster/user") or f"dagster run {context.run_id}"


class SelectionConfig(Config):
    error_type: str | None = Field(default=None, description="the kmq-error-type header")
    key: str | None = Field(default=None, description="the message key (UTF-8)")
    since: str | None = Field(
        default=None, description="dead-lettered at or after: ISO 8601, or a duration ago (2h)"
    )
    until: str | None = Field(default=None, description="dead-lettered before: as since")
    dry_run: bool = Field(default=True, description="list and count only (the default)")


class ReplayConfig(SelectionConfig):
    offsets: str | None = Field(default=None, description="DLQ partition:offsets, e.g. 0:10-20")
    target: str = Field(default="retry", description="retry (this group only) or original")
    rate_per_s: float | None = Field(default=None, description="copies per second at most")
    max_replays: int = Field(default=3, description="skip dead letters replayed this often")


def replay_job(spec: QueueSpec) -> JobDefinition:
    """``replay_<name>``: replay selected dead letters (audited)."""

    @op(name=f"replay_{spec.name}_dead_letters", tags=spec.tags)
    def replay(
        context: OpExecutionContext,
        config: ReplayConfig,
        kmq: KmqResource,
        audit: AuditStoreResource,
    ) -> None:
        selection = ReplaySelection(
            offsets={} if config.offsets is None else parse_offsets(config.offsets),
            key=None if config.key is None else config.key.encode(),
            error_type=config.error_type,
            since=None if config.since is None else parse_time(config.since),
            until=None if config.until is None else parse_time(config.until),
        )
        request = ReplayRequest(
            selection,
            target=config.target,
            dry_run=config.dry_run,
            rate_per_s=config.rate_per_s,
            max_replays=config.max_replays,
        )
        report = replay_dead_letters(
            kmq.open_queue(spec.queue),
            request,
            audit=audit.get_store(),
            actor=actor_of(context),
        )
        context.log.info(str(report))
        context.log_event(_summary(spec, "replay", str(report)))

    return queue_job(
        spec,
        "replay",
        replay,
        description=f"Replay {spec.queue}'s dead letters (default: a dry run of all of them).",
    )


def discard_job(spec: QueueSpec) -> JobDefinition:
    """``discard_<name>``: mark selected stored dead letters discarded (audited)."""

    @op(name=f"discard_{spec.name}_dead_letters", tags=spec.tags)
    def discard(
        context: OpExecutionContext, config: SelectionConfig, audit: AuditStoreResource
    ) -> int:
        now_ms = wall_clock_ms()
        where = DeadLetterFilter(
            queue_topic=spec.queue.topic,
            group_id=spec.queue.group,
            status="new",
            error_type=config.error_type,
            key=None if config.key is None else config.key.encode(),
            since=_moment(config.since, now_ms),
            until=_moment(config.until, now_ms),
        )
        count = audit.get_store().discard(where, actor=actor_of(context), dry_run=config.dry_run)
        verb = "would discard" if config.dry_run else "discarded"
        context.log.info(
            f"{verb} {counted(count, 'dead letter')} of {spec.queue} ({where.describe()})"
        )
        return count

    return queue_job(
        spec,
        "discard",
        discard,
        description=f"Discard {spec.queue}'s stored "
        "dead letters (default: a dry run of all of them).",
    )


class IngestConfig(Config):
    timeout_s: float = Field(default=120.0, description="give up reading the DLQ after this")
    dlq_topic: str | None = Field(
        default=None,
        description="a dead-letter topic another framework writes, ingested instead of this "
        "queue's DLQ (stored as the queue '<dlq_topic> / <dead_letter_format>')",
    )
    dead_letter_format: str = Field(
        default="kmq",
        description="how dlq_topic's headers name the original and the error: kmq or spring",
    )


def ingest_job(spec: QueueSpec) -> JobDefinition:
    """``ingest_<name>``: copy the whole DLQ into the audit store (idempotent)."""

    @op(name=f"ingest_{spec.name}_dead_letters", tags=spec.tags)
    def ingest(
        context: OpExecutionContext,
        config: IngestConfig,
        kmq: KmqResource,
        audit: AuditStoreResource,
    ) -> int:
        store = audit.get_store()
        opened = (
            open_foreign_dlq(kmq.get_settings(), config.dlq_topic, config.dead_letter_format)
            if config.dlq_topic
            else kmq.open_queue(spec.queue)
        )
        ingester = DlqIngester(opened, store)
        try:
            stats = run_ingest(ingester, store, actor=actor_of(context), timeout_s=config.timeout_s)
        finally:
            ingester.close()
        context.log.info(f"ingested {opened.queue.dlq_topic}: {ingester.describe_stats()}")
        return stats.stored

    return queue_job(
        spec, "ingest", ingest, description=f"Copy {spec.queue}'s DLQ into the audit store."
    )


def _moment(text: str | None, now_ms: int) -> datetime | None:
    if text is None:
        return None
    return datetime.fromtimestamp(resolve_time(parse_time(text), now_ms) / 1000, UTC)


def _summary(spec: QueueSpec, what: str, text: str) -> AssetObservation:
    return AssetObservation(
        asset_key=spec.queue_asset_key, metadata={f"last_{what}": MetadataValue.text(text)}
    )
