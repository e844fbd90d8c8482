"""A thread runner's run can be added to while it goes: its thread calls what joined it next,
in order, with no hand-off through the caller; once the thread has finished with the run,
nothing more joins it, and what joined a run that stops comes back as not started."""

from __future__ import annotations

import threading

import pytest

from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import CallEnd, Run, ThreadRunner, Unstarted
from tests.kafka_helpers import wait_for
from tests.unit.fakes import message


class FirstCallWaits:
    """Records (offset, thread) per call; offset 0 waits for ``release``, then fails if told."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.release = threading.Event()
        self.fail_first = fail_first
        self.calls: list[tuple[int, int]] = []

    def __call__(self, msg: KmqMessage) -> None:
        self.calls.append((msg.offset, threading.get_ident()))
        if msg.offset == 0:
            assert self.release.wait(120)
            if self.fail_first:
                raise RuntimeError("downstream refused")


def ends_until(runner: ThreadRunner, count: int) -> list[CallEnd | Unstarted]:
    ends: list[CallEnd | Unstarted] = []
    assert wait_for(lambda: len(ends.__iadd__(runner.take_ends(0.05))) >= count, timeout_s=30)
    return ends


def test_calls_added_to_a_running_run_run_next_on_its_thread_then_it_takes_no_more() -> None:
    handler = FirstCallWaits()
    runner = ThreadRunner(HandlerCall(handler), 4)
    messages = [message("orders", offset) for offset in range(4)]
    try:
        # given a run of two whose first call is running
        run = runner.submit_run([(messages[0], None), (messages[1], None)], joinable=True)
        assert wait_for(lambda: len(handler.calls) == 1, timeout_s=30)
        # when a third joins it, then its first call returns
        assert runner.extend_run(run, [(messages[2], 5)])
        handler.release.set()
        ends = ends_until(runner, 3)
        # then the three ran in order on the run's one thread, the joined one as a first call
        assert [offset for offset, _ in handler.calls] == [0, 1, 2]
        assert len({thread for _, thread in handler.calls}) == 1
        assert [(e.message.offset, e.error, e.first_call) for e in ends] == [  # type: ignore[union-attr]
            (0, None, False), (1, None, False), (2, None, True),
        ]  # fmt: skip
        # and a run its thread has finished with takes nothing more
        assert not runner.extend_run(run, [(messages[3], None)])
        assert runner.take_ends(0.2) == [] and len(handler.calls) == 3
    finally:
        handler.release.set()
        runner.close()


def test_what_joined_a_run_that_fails_comes_back_not_started_before_the_failure() -> None:
    handler = FirstCallWaits(fail_first=True)
    runner = ThreadRunner(HandlerCall(handler), 2)
    messages = [message("orders", offset) for offset in range(3)]
    try:
        run = runner.submit_run([(messages[0], None), (messages[1], None)], joinable=True)
        assert wait_for(lambda: len(handler.calls) == 1, timeout_s=30)
        assert runner.extend_run(run, [(messages[2], None)])
        handler.release.set()
        ends = ends_until(runner, 2)
        assert isinstance(ends[0], Unstarted) and ends[0].messages == messages[1:]
        assert isinstance(ends[1], CallEnd) and isinstance(ends[1].error, RuntimeError)
        assert [offset for offset, _ in handler.calls] == [0]
        assert not runner.extend_run(run, [(message("orders", 3), None)])
    finally:
        handler.release.set()
        runner.close()


def test_a_run_not_submitted_joinable_cannot_be_added_to() -> None:
    runner = ThreadRunner(HandlerCall(lambda msg: None), 1)
    try:
        run = runner.submit_run([(message("orders", 0), None)])
        with pytest.raises(ValueError, match="not submitted joinable"):
            runner.extend_run(run, [(message("orders", 1), None)])
    finally:
        runner.close()


def test_calls_added_while_a_runs_thread_finds_it_empty_still_run() -> None:
    """The race the lock in ``_close`` decides: a run's thread has called everything it held
    and is about to close the run when the caller adds to it. The thread is held at exactly
    that point (before it takes the lock), so the interleaving is certain, not hoped for."""
    calls: list[tuple[int, int]] = []
    runner = ThreadRunner(
        HandlerCall(lambda msg: calls.append((msg.offset, threading.get_ident()))), 2
    )
    at_close, go_on = threading.Event(), threading.Event()
    real_close = runner._close

    def close_after_the_caller(run: Run, *, only_if_empty: bool = False) -> list[KmqMessage]:
        if only_if_empty and not at_close.is_set():  # the run's first "anything left?"
            at_close.set()
            assert go_on.wait(60)
        return real_close(run, only_if_empty=only_if_empty)

    runner._close = close_after_the_caller  # type: ignore[method-assign]
    messages = [message("orders", offset) for offset in range(4)]
    try:
        # given a run whose thread called its one message and found nothing left
        run = runner.submit_run([(messages[0], None)], joinable=True)
        assert at_close.wait(60)
        # when the caller adds two before the thread closes the run
        assert runner.extend_run(run, [(messages[1], 7), (messages[2], 8)])
        go_on.set()
        # then the thread calls them too, in order, and reports every end
        ends = ends_until(runner, 3)
        assert [e.message.offset for e in ends] == [0, 1, 2]  # type: ignore[union-attr]
        assert [offset for offset, _ in calls] == [0, 1, 2]
        assert len({thread for _, thread in calls}) == 1
        # and it closed the run before reporting the last end: it takes nothing more now
        assert not runner.extend_run(run, [(messages[3], None)])
    finally:
        go_on.set()
        runner.close()
