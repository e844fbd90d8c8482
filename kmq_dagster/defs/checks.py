"""Asset checks of a queue: dead letters not growing, oldest unacknowledged age, breaker closed.

The same outcomes come from two places: the observation sensor emits them every tick, and the
asset check below (launched from the UI or a job) measures and decides on demand. Both call
:func:`queue_check_outcomes`.
"""

from collections.abc import Iterator
from datetime import UTC, datetime

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSpec,
    multi_asset_check,
)

from kmq_dagster.audit.store import AuditStore, DeadLetterFilter
from kmq_dagster.core.queue_checks import (
    BREAKER_CLOSED,
    DEAD_LETTERS_NOT_GROWING,
    OLDEST_UNACKED_AGE,
    CheckOutcome,
    breaker_closed,
    dead_letters_not_growing,
    oldest_unacked_age,
)
from kmq_dagster.core.status import QueueStatus
from kmq_dagster.defs.observations import check_result
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.operations.queue_status import measure_queue

_DESCRIPTIONS = {
    DEAD_LETTERS_NOT_GROWING: "WARN when more new dead letters than the threshold arrived "
    "within the window",
    OLDEST_UNACKED_AGE: "ERROR when a message is unacknowledged for longer than visibility "
    "timeout x (max redeliveries + 1): the redelivery tracker is not doing its job",
    BREAKER_CLOSED: "ERROR while the group's circuit breaker is open",
}


def dead_letters_in_window(spec: QueueSpec, status: QueueStatus, store: AuditStore) -> int:
    """Dead letters of the last ``spec.dead_letter_window_ms``: those stored with a failure
    time in the window, plus those still waiting to be ingested (they are the newest)."""
    since_ms = status.measured_at_ms - spec.dead_letter_window_ms
    since = datetime.fromtimestamp(since_ms / 1000, UTC)
    queue = spec.queue
    where = DeadLetterFilter(queue_topic=queue.topic, group_id=queue.group, since=since)
    return store.count_dead_letters(where) + status.dlq_uningested


def queue_check_outcomes(
    spec: QueueSpec, status: QueueStatus, store: AuditStore
) -> list[CheckOutcome]:
    """The three queue checks, decided from one measurement."""
    queue = spec.queue
    return [
        dead_letters_not_growing(
            dead_letters_in_window(spec, status, store),
            threshold=spec.dead_letter_threshold,
            window_ms=spec.dead_letter_window_ms,
        ),
        oldest_unacked_age(
            status.oldest_unacked_age_ms,
            visibility_timeout_ms=queue.visibility_timeout_ms,
            max_redeliveries=queue.max_redeliveries,
        ),
        breaker_closed(
            status.breaker_state,
            opened_at_ms=status.breaker_opened_at_ms,
            cooldown_ms=status.breaker_cooldown_ms,
        ),
    ]


def queue_checks(spec: QueueSpec) -> AssetChecksDefinition:
    """The asset checks of ``spec``'s queue asset, measured when they run."""
    key = spec.queue_asset_key

    @multi_asset_check(
        name=f"check_{spec.name}",
        specs=[
            AssetCheckSpec(name, asset=key, description=description)
            for name, description in _DESCRIPTIONS.items()
        ],
    )
    def check_queue(
        context: AssetCheckExecutionContext, kmq: KmqResource, audit: AuditStoreResource
    ) -> Iterator[AssetCheckResult]:
        store = audit.get_store()
        status = measure_queue(kmq.open_queue(spec.queue), store=store)
        for outcome in queue_check_outcomes(spec, status, store):
            context.log.info(f"{outcome.name}: {outcome.description}")
            yield check_result(outcome, key)

    return check_queue
