"""An opened queue: built only by opening or provisioning, derived without a check, and trusted
by every component (none reads the registry or the cluster's metadata to check it again)."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest

from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.kafka import provision, provision_plan, queues, registry
from kmq_dagster.kafka.consumer import KmqConsumer
from kmq_dagster.kafka.opened_queue import OpenedQueue, vouch_for
from kmq_dagster.kafka.redelivery_tracker import RedeliveryTracker
from kmq_dagster.kafka.retry_router import RetryRouter
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.worker import Worker
from tests.unit.fakes import FakeClock, FakeProducer

#: Nothing listens there: a client that tried to talk to it would only time out.
NOWHERE = KmqSettings(bootstrap_servers="127.0.0.1:1")
QUEUE = Queue("orders", "billing", partitions=3, retry_policy=RetryPolicy.fixed([5_000]))


def test_an_opened_queue_cannot_be_built_from_an_unchecked_queue() -> None:
    with pytest.raises(TypeError, match=r"comes from open_queue\(\) or provision_queue\(\)"):
        OpenedQueue(NOWHERE, QUEUE)
    with pytest.raises(TypeError, match="comes from"):
        OpenedQueue(NOWHERE, QUEUE, "checked")


def test_a_derived_handle_adds_fatal_error_types_and_keeps_the_original() -> None:
    # given an opened queue
    opened = vouch_for(NOWHERE, QUEUE)

    # when a caller adds its fatal error types
    fatal = opened.with_non_retryable(["ValueError", " KeyError "])

    # then the new handle has them, the opened one is unchanged, and the rest is the same
    assert fatal.queue.retry_policy.non_retryable == frozenset({"ValueError", "KeyError"})
    assert opened.queue.retry_policy.non_retryable == frozenset()
    assert (fatal.settings, fatal.topic, fatal.group, fatal.partitions) == (
        NOWHERE, "orders", "billing", 3,
    )  # fmt: skip
    assert fatal.queue.retry_topics == opened.queue.retry_topics


def test_a_handle_shipped_to_a_spark_executor_is_still_one() -> None:
    shipped = pickle.loads(pickle.dumps(vouch_for(NOWHERE, QUEUE)))

    assert shipped.with_non_retryable(["ValueError"]).queue.retry_policy.is_retryable("E")


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every registry read and metadata request opening makes, counted (and answered with an
    error, so a component that needs one fails)."""
    calls: list[str] = []

    def counted(name: str) -> Any:
        def call(*_args: object, **_kwargs: object) -> Any:
            calls.append(name)
            raise AssertionError(f"{name} called")

        return call

    monkeypatch.setattr(queues, "load_registry", counted("load_registry"))
    monkeypatch.setattr(queues, "require_topics", counted("require_topics"))
    monkeypatch.setattr(provision, "load_registry", counted("load_registry"))
    monkeypatch.setattr(provision_plan, "cluster_metadata", counted("cluster_metadata"))
    monkeypatch.setattr(registry, "cluster_metadata", counted("cluster_metadata"))
    return calls


def test_components_given_a_handle_make_no_round_trip_to_check_the_queue(
    round_trips: list[str],
) -> None:
    # given an opened queue on a cluster nobody can reach
    opened = vouch_for(NOWHERE, QUEUE).with_non_retryable(["ValueError"])

    # when every component is built from it
    fake: Any = FakeProducer()
    consumer = KmqConsumer(opened, clock_ms=FakeClock(), producer=fake)
    router = RetryRouter(opened, clock_ms=FakeClock(), rng=random.Random(1), producer=fake)
    worker = Worker(opened, lambda message: None)
    tracker = RedeliveryTracker(opened)
    ingester = DlqIngester(opened, store=None)  # type: ignore[arg-type]

    # then they take the handle's definition as it is, without reading the registry or metadata
    assert round_trips == []
    assert consumer.queue is opened.queue and tracker.queue is opened.queue
    assert consumer.visibility_timeout_ms == QUEUE.visibility_timeout_ms
    assert not router.policy.is_retryable("ValueError")
    assert not worker.router.policy.is_retryable("ValueError")
    assert ingester.dlq_topic == "orders.billing.dlq"
