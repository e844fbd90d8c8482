"""A thread runner's run can be added to while it goes: its thread calls what joined it next,
in order, with no hand-off through the caller; once the thread has finished with the run,
nothing more joins it, and what joined a run that stops comes back as not started."""

from __future__ import annotations

import threading

import pytest

from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import CallEnd, ThreadRunner, Unstarted
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
