"""A thread runner wakes its caller only when the caller has something to do, yet an end that
woke nobody is still taken by the next take, and a failure wakes a waiting caller at once even
while runs are queued for the threads."""

from __future__ import annotations

import threading

from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import CallEnd, ThreadRunner, Unstarted
from tests.kafka_helpers import wait_for
from tests.unit.fakes import message


def test_a_failure_wakes_a_waiting_caller_and_no_end_is_lost_while_runs_are_queued() -> None:
    gates = [threading.Event() for _ in range(4)]
    started: list[int] = []

    def handler(msg: object) -> None:
        offset = msg.offset  # type: ignore[attr-defined]
        started.append(offset)
        gates[offset].wait(120)
        if offset == 1:
            raise RuntimeError("downstream refused")

    # given two threads busy with the first two runs, and two more runs queued behind them
    runner = ThreadRunner(HandlerCall(handler), 2)
    messages = [message("orders", offset) for offset in range(4)]
    try:
        for msg in messages:
            runner.submit_run([(msg, None)])
        assert wait_for(lambda: sorted(started) == [0, 1], timeout_s=30)

        # when the first call returns while runs are still queued (it wakes nobody)
        gates[0].set()
        assert wait_for(lambda: len(started) == 3, timeout_s=30)  # its thread took the next

        # then the next take still gets its end
        first = runner.take_ends(0.0)
        assert [(end.message, end.error) for end in first if isinstance(end, CallEnd)] == [
            (messages[0], None)
        ]

        # and when a call fails while the caller waits, the caller wakes long before its timeout
        taken: list[CallEnd | Unstarted] = []
        caller = threading.Thread(target=lambda: taken.extend(runner.take_ends(60.0)), daemon=True)
        caller.start()
        gates[1].set()
        caller.join(timeout=30)
        assert not caller.is_alive(), "a failed call's end did not wake the caller"
        assert len(taken) == 1 and isinstance(taken[0], CallEnd)
        assert taken[0].message is messages[1]
        assert isinstance(taken[0].error, RuntimeError)
    finally:
        for gate in gates:
            gate.set()
        runner.close()
