"""Python alone on the benchmark's waits (``kmq bench parallel``'s floor), and kmq's thread
runner alone on them: key order runs each key's waits one after the other, as the worker's key
order does; unordered runs every wait on its own."""

from __future__ import annotations

import pytest

from kmq_dagster.bench.parallel_bare import bare_asyncio_s, bare_threads_s, lanes_of
from kmq_dagster.bench.parallel_runner_alone import runner_threads_s

# uvloop keeps its timers in whole milliseconds (libuv's clock), so an ``asyncio.sleep`` may
# end up to 1 ms before ``time.perf_counter`` says it should (CI saw 39.89 ms for 40): each
# wait taken in turn may come that much short.
TIMER_RESOLUTION_S = 0.001


def test_lanes_hold_every_message_once_each_key_in_offset_order() -> None:
    keyed = lanes_of(10, 3, keyed=True)

    assert keyed == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert lanes_of(3, 3, keyed=False) == [[0], [1], [2]]


@pytest.mark.parametrize("measure", [bare_threads_s, bare_asyncio_s, runner_threads_s])
def test_key_order_waits_for_each_keys_messages_in_turn(measure: object) -> None:
    # Key 0 (messages 0, 4, 8, 12) waits 40 ms each; the others not at all: in key order
    # no run can take less than key 0's 160 ms, whatever the concurrency.
    waits_s = [0.04 if index % 4 == 0 else 0.0 for index in range(16)]

    assert measure(waits_s, 4, 16, keyed=True) >= 0.16 - 4 * TIMER_RESOLUTION_S  # type: ignore[operator]
    assert measure(waits_s, 4, 16, keyed=False) >= 0.04 - TIMER_RESOLUTION_S  # type: ignore[operator]


@pytest.mark.parametrize("measure", [bare_threads_s, bare_asyncio_s, runner_threads_s])
def test_no_more_than_concurrency_waits_run_at_once(measure: object) -> None:
    # Eight waits of 40 ms, two at a time: four rounds, whatever the ordering.
    waits_s = [0.04] * 8

    assert measure(waits_s, 8, 2, keyed=False) >= 0.16 - 4 * TIMER_RESOLUTION_S  # type: ignore[operator]
