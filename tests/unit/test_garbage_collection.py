"""While workers run the collector's first threshold is raised, and the last to stop puts
back what it found (``kmq_dagster.worker.garbage_collection``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.opened_queue import vouch_for
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.garbage_collection import GC_FIRST_THRESHOLD, fewer_collections
from kmq_dagster.worker.worker import Worker


@pytest.fixture(autouse=True)
def default_thresholds() -> Iterator[None]:
    """Each test starts from CPython's defaults and leaves the process as it found it."""
    found = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*found)


def test_the_first_threshold_is_raised_while_a_worker_runs_and_put_back_after() -> None:
    with fewer_collections():
        assert gc.get_threshold() == (GC_FIRST_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_the_process_set_is_left_alone() -> None:
    gc.set_threshold(50_000, 20, 30)
    with fewer_collections():
        assert gc.get_threshold() == (50_000, 20, 30)
    assert gc.get_threshold() == (50_000, 20, 30)


def test_the_last_of_two_overlapping_workers_puts_the_threshold_back() -> None:
    first, second = fewer_collections(), fewer_collections(20_000)
    first.__enter__()
    second.__enter__()
    assert gc.get_threshold()[0] == 20_000
    first.__exit__(None, None, None)
    assert gc.get_threshold()[0] == 20_000  # the second still runs
    second.__exit__(None, None, None)
    assert gc.get_threshold()[0] == 700


def test_a_threshold_changed_while_the_worker_ran_is_kept() -> None:
    with fewer_collections():
        gc.set_threshold(3_000, 10, 10)  # the application's own choice, made meanwhile
    assert gc.get_threshold() == (3_000, 10, 10)


def test_it_is_put_back_when_the_worker_fails() -> None:
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("the loop failed")
    assert gc.get_threshold() == (700, 10, 10)


def test_none_leaves_the_collector_alone() -> None:
    with fewer_collections(None):
        assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("threshold", [0, -1])
def test_a_worker_refuses_a_threshold_below_one(threshold: int) -> None:
    opened = vouch_for(KmqSettings(), Queue("orders", "billing", partitions=1))
    with pytest.raises(ConfigError, match=rf"^gc_threshold must be >= 1, got {threshold}$"):
        Worker(opened, lambda _message: None, gc_threshold=threshold)
