"""The consumer's view pool: views nobody holds are reused, views anybody holds never change."""

from __future__ import annotations

import gc
import sys

from confluent_kafka import Message

from kmq_dagster.kafka.message import KmqMessage, ViewPool


def batch(first: int, size: int = 5, headers: bool = False) -> list[Message]:
    return [
        Message(
            topic="orders",
            partition=0,
            offset=offset,
            value=str(offset).encode(),
            headers=[("n", str(offset).encode())] if headers else None,
        )
        for offset in range(first, first + size)
    ]


def test_views_of_a_batch_nobody_holds_come_back_for_a_later_batch() -> None:
    pool = ViewPool()
    first_ids = {id(view) for view in pool.views_of(batch(0))}
    pool.views_of(batch(5))  # the caller's variable would hold this one while asking again

    third = pool.views_of(batch(10))

    assert {id(view) for view in third} == first_ids
    assert [view.offset for view in third] == [10, 11, 12, 13, 14]
    assert [view.value for view in third] == [str(o).encode() for o in range(10, 15)]


def test_in_steady_state_no_view_is_allocated() -> None:
    pool = ViewPool()
    for first in range(0, 50, 5):
        for view in pool.views_of(batch(first)):
            assert view.record.offset() == view.offset

    assert pool.allocated == 10  # two batches' worth, then only reuse
    assert pool.reused == 40


def test_a_view_the_caller_kept_never_changes() -> None:
    pool = ViewPool()
    kept = pool.views_of(batch(0))[3]
    for first in range(5, 100, 5):
        pool.views_of(batch(first))

    assert kept.offset == 3 and kept.value == b"3"
    # the kept one was replaced once; from then on every view was reused
    assert pool.allocated == 11


def test_no_view_of_a_batch_the_caller_kept_changes() -> None:
    pool = ViewPool()
    kept = pool.views_of(batch(0))
    for first in range(5, 50, 5):
        pool.views_of(batch(first))

    assert [view.offset for view in kept] == [0, 1, 2, 3, 4]
    assert not {id(view) for view in kept} & {id(view) for view in pool.views_of(batch(50))}


def test_a_reused_view_reads_the_headers_of_its_new_record() -> None:
    pool = ViewPool()
    for view in pool.views_of(batch(0, headers=True)):
        assert view.headers == [("n", str(view.offset).encode())]  # cached on first read
    pool.views_of(batch(5))

    reused = pool.views_of(batch(10, headers=True))

    assert [view.headers for view in reused] == [[("n", str(o).encode())] for o in range(10, 15)]
    assert reused[0].redelivery_count == 0


def test_views_are_fresh_objects_like_the_constructor_makes() -> None:
    pool = ViewPool()
    views = pool.views_of(batch(0))
    constructed = KmqMessage(batch(0)[0])

    assert all(type(view) is KmqMessage for view in views)
    assert [getattr(views[0], slot) is None for slot in ("_headers",)] == [
        getattr(constructed, slot) is None for slot in ("_headers",)
    ]
    assert pool.views_of([]) == []


def test_handing_out_views_in_steady_state_triggers_no_garbage_collection() -> None:
    pool = ViewPool()
    records = [batch(first, size=500) for first in range(0, 20_000, 500)]
    collections = []
    gc.callbacks.append(lambda phase, info: collections.append(phase))
    try:
        gc.collect()
        collections.clear()
        for chunk in records:
            views = pool.views_of(chunk)
        del views
    finally:
        gc.callbacks.pop()

    # 40 batches of 500 new views each would pass the generation-0 threshold (700) ~28 times
    assert len(collections) <= 2 * 2


def test_views_still_buffered_when_their_batch_is_reclaimed_are_reused_once_released() -> None:
    # A worker at concurrency 100 holds its last fetches' messages one by one (its buffer and
    # its calls in flight) well past the pool's reclaim: those views wait and come back later.
    pool = ViewPool()
    buffered: list[list[KmqMessage]] = []
    for first in range(0, 400, 10):
        buffered.append(list(pool.views_of(batch(first, size=10))))
        if len(buffered) > 3:
            buffered.pop(0)

    assert pool.allocated <= 60  # six batches' worth, then reuse (not a new batch each time)
    assert pool.reused >= 340


def test_a_batch_whose_list_somebody_holds_is_reused_after_they_let_it_go() -> None:
    pool = ViewPool()
    held = pool.views_of(batch(0))  # as the consumer's handout ledger holds a batch's list
    first_ids = {id(view) for view in held}
    pool.views_of(batch(5))
    pool.views_of(batch(10))  # batch 0 is reclaimed here, while its list is held
    assert [view.offset for view in held] == [0, 1, 2, 3, 4]
    del held

    later = [id(view) for first in (15, 20) for view in pool.views_of(batch(first))]

    assert first_ids <= set(later)


def test_views_a_caller_keeps_for_good_are_let_go_by_the_pool() -> None:
    pool = ViewPool()
    kept: list[KmqMessage] = []
    for first in range(0, 200, 5):
        kept += pool.views_of(batch(first))

    assert [view.offset for view in kept] == list(range(200))
    # ``kept`` and the argument: the pool waits for a bounded number of views, not for ever
    references = sys.getrefcount(kept[0])
    assert references == 2
