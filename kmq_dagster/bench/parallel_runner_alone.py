"""kmq's thread runner alone on ``kmq bench parallel``'s waits: no Kafka, no worker loop.

The same seeded waits as the worker's sync runs, called by the
:class:`~kmq_dagster.worker.handler_runner.ThreadRunner` the worker uses, handed over as the
worker loop hands them (each key's lane as one run, each message of ``unordered`` order as a
run of its own without a run object, up to ``RUNS_QUEUED_PER_THREAD`` runs a thread at once,
the next run when one ends) by a caller that does nothing else: no fetch, no
bookkeeping, no acknowledgement. Every key's messages are there from the start, so a key is one
run. What this takes bounds the worker's threads shapes from below, between Python alone
(:mod:`~kmq_dagster.bench.parallel_bare`) and the worker: the runner's hand-offs and the
threads' contention for the GIL, without the loop's own Python (which the threads wait for too:
docs/benchmarks.md, stop 66).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kmq_dagster.bench.parallel_bare import lanes_of
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import CallEnd, RunJob, ThreadRunner
from kmq_dagster.worker.loop import END_WAIT_S, RUNS_QUEUED_PER_THREAD


def runner_threads_s(waits_s: Sequence[float], keys: int, concurrency: int, keyed: bool) -> float:
    """Seconds for a ``ThreadRunner`` of ``concurrency`` threads to sleep through every wait,
    each lane as one run (message ``i``'s key is ``i % keys``)."""
    lanes = lanes_of(len(waits_s), keys, keyed)
    lasts = {lane[-1] for lane in lanes}

    def handle(index: int) -> None:
        time.sleep(waits_s[index])

    runner = ThreadRunner(HandlerCall(handle), concurrency, name="kmq-bench-runner")
    # The runner only hashes and hands back what it is given: message indices do.
    runs: list[list[RunJob]] = [[(index, None) for index in lane] for lane in lanes]  # type: ignore[misc]
    # As the worker loop hands them over: a key's lane as a run, an unordered message alone.
    submit = runner.submit_run if keyed else runner.submit_singles
    started = time.perf_counter()
    try:
        handed = min(len(runs), RUNS_QUEUED_PER_THREAD * concurrency)
        for run in runs[:handed]:
            submit(run)
        left = len(waits_s)
        while left:
            for end in runner.take_ends(END_WAIT_S):
                if not isinstance(end, CallEnd) or end.error is not None:
                    raise RuntimeError(f"a call of the runner alone did not return: {end!r}")
                left -= 1
                message: Any = end.message
                if message in lasts and handed < len(runs):
                    submit(runs[handed])
                    handed += 1
        return time.perf_counter() - started
    finally:
        runner.close()
