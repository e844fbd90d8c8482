"""Assets of a queue: the queue itself (observed by a sensor) and its processed output.

No ``from __future__ import annotations`` here: Dagster reads the signatures of the asset
functions (config and resource parameters) at run time.
"""

from datetime import timedelta

from dagster import (
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    Config,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)
from dagster_pyspark import PySparkResource
from pydantic import Field

from kmq_dagster.core.queue import Queue
from kmq_dagster.core.queue_checks import OUTPUT_MATCHES_ACKS, output_matches_acks
from kmq_dagster.core.queue_settings import setting_named
from kmq_dagster.defs.observations import check_result
from kmq_dagster.defs.processing import ensure_queue
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.errors import ConfigError
from kmq_dagster.spark.job import BatchReport, SparkQueueJob
from kmq_dagster.spark.processing import ProcessingReport, run_processing

#: Dagster asset group of every kmq asset.
GROUP_NAME = "kmq"


def queue_asset(spec: QueueSpec) -> AssetSpec:
    """The queue as an external asset; the observation sensor records its observations."""
    queue = spec.queue
    return AssetSpec(
        key=spec.queue_asset_key,
        description=f"Kafka queue {queue.topic} worked by consumer group {queue.group}: lag, "
        "in flight, retries, dead letters and breaker state are recorded as observations.",
        group_name=GROUP_NAME,
        kinds={"kafka"},
        metadata={
            "topic": MetadataValue.text(queue.topic),
            "group": MetadataValue.text(queue.group),
            "partitions": MetadataValue.int(queue.partitions or 0),
            "retry_policy": MetadataValue.text(queue.retry_policy.describe()),
            "visibility_timeout_ms": MetadataValue.int(queue.visibility_timeout_ms),
            "max_redeliveries": MetadataValue.int(queue.max_redeliveries),
            "dlq_topic": MetadataValue.text(queue.dlq_topic),
        },
    )


class ProcessingConfig(Config):
    """Limits of one processing run; the defaults are the queue's declaration."""

    max_seconds: float | None = Field(
        default=None, description=f"{setting_named('max_run_seconds').help} (default: declared)"
    )
    max_messages_per_partition: int | None = Field(
        default=None,
        description=f"{setting_named('max_messages_per_partition').help} (default: declared)",
    )


def processing_asset(spec: QueueSpec) -> AssetsDefinition:
    """The Parquet output of ``spec``'s queue, materialized by Spark batches until idle."""
    output_key = spec.output_asset_key

    @asset(
        key=output_key,
        deps=[spec.queue_asset_key],
        group_name=GROUP_NAME,
        kinds={"spark", "parquet"},
        description=f"Messages of {spec.queue} processed on Spark and appended to "
        f"{spec.output_path}; one row per message, deduplicate by (topic, partition, offset).",
        check_specs=[
            AssetCheckSpec(
                OUTPUT_MATCHES_ACKS,
                asset=output_key,
                description="the run's output rows, deduplicated by coordinates, against the "
                "messages it acknowledged",
            )
        ],
        metadata={
            "path": MetadataValue.path(spec.output_path or ""),
            **concurrency_metadata(spec),
        },
        op_tags=spec.tags,
        freshness_policy=output_freshness_policy(spec),
    )
    def process_queue(
        context: AssetExecutionContext,
        config: ProcessingConfig,
        kmq: KmqResource,
        audit: AuditStoreResource,
        pyspark: PySparkResource,
    ) -> MaterializeResult:  # type: ignore[type-arg]
        settings = kmq.get_settings()
        opened = ensure_queue(settings, spec.queue)
        queue = opened.queue
        store = audit.get_store()
        job = SparkQueueJob(
            pyspark.spark_session,
            opened,
            output_path=spec.output_path or "",
            function=spec.function,
            transform=spec.transform,
            max_messages_per_partition=config.max_messages_per_partition
            or spec.max_messages_per_partition,
            concurrency=spec.concurrency,
            ordering=spec.ordering,
        )

        def log_batch(batch: BatchReport) -> None:
            context.log.info(
                f"batch {batch.batch_id}: read {batch.read}, succeeded {batch.succeeded}, "
                f"failed {batch.failed}"
            )

        try:
            report = run_processing(
                job,
                store,
                max_seconds=config.max_seconds or spec.max_run_seconds,
                on_batch=log_batch,
            )
        finally:
            job.close()
        return _materialized(context, spec, queue, report)

    return process_queue


def output_freshness_policy(spec: QueueSpec) -> FreshnessPolicy | None:
    """Processed within ``freshness_minutes`` of arrival, as Dagster's time-window policy:
    FAIL once the output's last materialization is older (Dagster's windows are 1 minute at
    least). A queue with no arrivals fails it too: its backlog sensor launches no run.

    Raises:
        ConfigError: ``freshness_minutes`` is below 1.
    """
    if spec.freshness_minutes is None:
        return None
    if spec.freshness_minutes < 1:
        raise ConfigError(
            f"queue {spec.queue}: freshness_minutes must be at least 1", setting="freshness_minutes"
        )
    return FreshnessPolicy.time_window(fail_window=timedelta(minutes=spec.freshness_minutes))


def _materialized(
    context: AssetExecutionContext, spec: QueueSpec, queue: Queue, report: ProcessingReport
) -> MaterializeResult:  # type: ignore[type-arg]
    context.log.info(f"processing of {queue} ended ({report.stopped}): {report}")
    outcome = output_matches_acks(
        report.rows_written,
        report.distinct_rows,
        report.succeeded,
        exact=spec.transform is None,
    )
    return MaterializeResult(
        metadata={**report_metadata(report), **concurrency_metadata(spec)},
        check_results=[check_result(outcome, spec.output_asset_key)],
    )


def concurrency_metadata(spec: QueueSpec) -> dict[str, MetadataValue]:
    """How many calls of the function run at once per Spark task, and in what order."""
    return {
        "concurrency": MetadataValue.int(spec.concurrency),
        "ordering": MetadataValue.text(str(spec.ordering)),
    }


def report_metadata(report: ProcessingReport) -> dict[str, MetadataValue]:
    """A processing run's figures as materialization metadata."""
    return {
        "read": MetadataValue.int(report.read),
        "succeeded": MetadataValue.int(report.succeeded),
        "failed": MetadataValue.int(report.failed),
        "retried": MetadataValue.int(report.retried),
        "dead_lettered": MetadataValue.int(report.dead_lettered),
        "redelivered": MetadataValue.int(report.redelivered),
        "rows_written": MetadataValue.int(report.rows_written),
        "distinct_rows": MetadataValue.int(report.distinct_rows),
        "batches": MetadataValue.int(report.batches),
        "duration_s": MetadataValue.float(round(report.duration_s, 3)),
        "msgs_per_s": MetadataValue.float(round(report.msgs_per_s, 1)),
        "output_path": MetadataValue.path(report.output_path),
        "stopped": MetadataValue.text(report.stopped),
        "batch_leases": MetadataValue.json(report.leases),
    }
