"""A running worker collects garbage less often, and gives the process its collector back
(``kmq_dagster.worker.garbage_collection``)."""

from __future__ import annotations

import gc

import pytest

from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.settings import KmqSettings
from kmq_dagster.worker.garbage_collection import GC_FIRST_THRESHOLD
from tests.kafka_helpers import new_queue, produce, running_worker, wait_for

pytestmark = pytest.mark.kafka


def test_a_worker_raises_the_first_threshold_while_it_runs_and_puts_it_back_when_it_stops(
    settings: KmqSettings, topic_name: str
) -> None:
    # given a process with CPython's default thresholds, and a message for a worker
    found = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        opened = new_queue(settings, topic_name)
        produce(settings, topic_name, [b"first"])
        seen: list[tuple[int, int, int]] = []

        def handler(_message: KmqMessage) -> None:
            seen.append(gc.get_threshold())

        # when the worker handles it
        with running_worker(opened, handler):
            assert wait_for(lambda: seen, timeout_s=60)
        # then its call ran with the raised threshold, and the process has its own back
        assert seen[0] == (GC_FIRST_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*found)
