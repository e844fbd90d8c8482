"""A queue's status as Dagster metadata, and check outcomes as Dagster check events."""

from __future__ import annotations

from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
)

from kmq_dagster.core.queue_checks import WARN, CheckOutcome
from kmq_dagster.core.readable import duration_text
from kmq_dagster.core.status import QueueStatus, Rates

_LAG_SCHEMA = TableSchema(
    columns=[
        TableColumn("topic", "string"),
        TableColumn("partition", "int"),
        TableColumn("end_offset", "int"),
        TableColumn("committed", "int"),
        TableColumn("lag", "int"),
    ]
)


def status_metadata(
    status: QueueStatus, rates: Rates | None = None, new_dead_letters: int | None = None
) -> dict[str, MetadataValue]:
    """What an observation of the queue asset carries (typed values, not strings)."""
    metadata: dict[str, MetadataValue] = {
        "lag": MetadataValue.int(status.lag),
        "lag_by_partition": MetadataValue.table(
            [
                TableRecord(
                    {
                        "topic": p.topic,
                        "partition": p.partition,
                        "end_offset": p.end_offset,
                        "committed": p.committed,
                        "lag": p.pending,
                    }
                )
                for p in (*status.lags, *status.redelivery)
            ],
            schema=_LAG_SCHEMA,
        ),
        # The redelivery topic holds the tracker's redeliveries and operators' replays alike.
        "redelivered_or_replayed_waiting": MetadataValue.int(status.redelivery_lag),
        "in_flight": MetadataValue.int(status.inflight),
        "overdue_in_flight": MetadataValue.int(status.overdue),
        "markers_read_to_end": MetadataValue.bool(status.markers_complete),
        "retry_depths": MetadataValue.json(status.retry_depths),
        "retries_due": MetadataValue.int(status.due_retries),
        "dlq_depth": MetadataValue.int(status.dlq_depth),
        "dlq_not_ingested": MetadataValue.int(status.dlq_uningested),
        "breaker_state": MetadataValue.text(status.breaker_state),
    }
    age_ms = status.oldest_unacked_age_ms
    if age_ms is not None:
        metadata["oldest_unacked_age_s"] = MetadataValue.float(age_ms / 1000)
    if status.breaker_opened_at_ms is not None:
        metadata["breaker_opened_at"] = MetadataValue.timestamp(status.breaker_opened_at_ms / 1000)
    if status.next_retry_due_ms is not None:
        metadata["next_retry_due"] = MetadataValue.timestamp(status.next_retry_due_ms / 1000)
    if new_dead_letters is not None:
        metadata["new_dead_letters"] = MetadataValue.int(new_dead_letters)
    if rates is not None:
        metadata["in_per_s"] = MetadataValue.float(round(rates.in_per_s, 2))
        metadata["ack_per_s"] = MetadataValue.float(round(rates.ack_per_s, 2))
        metadata["failures_per_s"] = MetadataValue.float(round(rates.failures_per_s, 2))
    return metadata


def _severity(outcome: CheckOutcome) -> AssetCheckSeverity:
    return AssetCheckSeverity.WARN if outcome.severity == WARN else AssetCheckSeverity.ERROR


def _figures(outcome: CheckOutcome) -> dict[str, MetadataValue]:
    """The outcome's figures as typed metadata; a point in time (``*_at_ms``, epoch ms) as a
    timestamp named without the unit, which Dagster shows as a time rather than plotting a
    number near 1.8e12; a duration (``*_ms``) as a person reads it (``window: 15m``, not
    ``window_ms: 900000``)."""
    typed: dict[str, MetadataValue] = {}
    for name, value in outcome.figures.items():
        if isinstance(value, bool) or value is None:
            continue
        if name.endswith("_at_ms") and isinstance(value, int):
            typed[name.removesuffix("_ms")] = MetadataValue.timestamp(value / 1000)
        elif name.endswith("_ms") and isinstance(value, int):
            typed[name.removesuffix("_ms")] = MetadataValue.text(duration_text(value))
        elif isinstance(value, int):
            typed[name] = MetadataValue.int(value)
        elif isinstance(value, float):
            typed[name] = MetadataValue.float(value)
        else:
            typed[name] = MetadataValue.text(value)
    return typed


def _check_fields(outcome: CheckOutcome) -> dict[str, Any]:
    """What both Dagster forms of ``outcome`` carry: everything but the asset it is about."""
    return {
        "check_name": outcome.name,
        "passed": outcome.passed,
        "severity": _severity(outcome),
        "description": outcome.description,
        "metadata": _figures(outcome),
    }


def check_evaluation(outcome: CheckOutcome, asset_key: AssetKey) -> AssetCheckEvaluation:
    """``outcome`` as an event a sensor emits (``SensorResult(asset_events=...)``)."""
    return AssetCheckEvaluation(asset_key=asset_key, **_check_fields(outcome))


def check_result(outcome: CheckOutcome, asset_key: AssetKey | None = None) -> AssetCheckResult:
    """``outcome`` as what an asset check (or an asset with check specs) returns."""
    return AssetCheckResult(asset_key=asset_key, **_check_fields(outcome))
