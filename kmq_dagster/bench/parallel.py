"""``kmq bench parallel``: many messages at once through the real :class:`Worker`.

* **Parallel Consumer's shape** (its README's benchmark): 10,000 messages, 100 keys, one
  partition, a handler waiting a uniform 0-5 ms (seeded: every run waits the same), at
  concurrency 100 in each ordering, as a sync handler (``time.sleep``, threads) and as an
  ``async def`` one (``asyncio.sleep``, one event loop).
* **I/O scale**: an ``async def`` handler awaiting 20 ms, 100,000 messages on 2 partitions,
  concurrency 1,000, unordered: ``io_msgs_per_s`` (at most 50,000: 1,000 calls / 20 ms).
* **No regression at N = 1**: a no-op handler at the default concurrency 1 (the worker loop
  with calls on its own thread, through ``HandlerCall``, which awaits what a handler returns)
  against the same loop calling the handler directly as before async handlers existed; and,
  for context, the same loop at concurrency 2 (the partition's messages handed to a handler
  thread in runs).

Each round gets its own ``cluster()`` and runs the shapes in a rotated order; figures are
medians over the rounds. Times run from the first handler call to the last acknowledgement
(:mod:`kmq_dagster.bench.parallel_runs`). The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kmq_dagster.bench.common import Cluster, Report, rotated
from kmq_dagster.bench.parallel_bare import bare_asyncio_s, bare_threads_s
from kmq_dagster.bench.parallel_memory import SAMPLE_EVERY_S, RssFigures, drain_with_rss
from kmq_dagster.bench.parallel_runner_alone import runner_threads_s
from kmq_dagster.bench.parallel_runs import (
    CallLog,
    Drain,
    Handler,
    awaiting,
    filled_queue,
    no_op,
    sleeping,
    timed_drain,
)
from kmq_dagster.core.ordering import Ordering
from kmq_dagster.settings import KmqSettings

#: Parallel Consumer's README figures for the same shape, in seconds.
PARALLEL_CONSUMER_S = {"partition": 22.2, "key": 2.1, "unordered": 2.8}
SHAPES: dict[str, tuple[Ordering, bool]] = {
    "key": (Ordering.KEY, False),
    "unordered": (Ordering.UNORDERED, False),
    "partition": (Ordering.PARTITION, False),
    "async_key": (Ordering.KEY, True),
    "async_unordered": (Ordering.UNORDERED, True),
    "async_partition": (Ordering.PARTITION, True),
}
NO_OP_RUNS = ("noop_n1", "noop_n1_direct", "noop_concurrent_loop")


@dataclass(frozen=True)
class ParallelSizes:
    messages: int = 10_000
    keys: int = 100
    concurrency: int = 100
    max_wait_ms: float = 5.0
    io_messages: int = 100_000
    io_concurrency: int = 1_000
    io_partitions: int = 2
    io_wait_ms: float = 20.0
    noop_messages: int = 300_000
    #: A handler thread runs these in runs (over 100k a second since stop 50; 13-15k before).
    noop_concurrent_messages: int = 200_000
    rounds: int = 3
    seed: int = 7

    def waits_s(self) -> list[float]:
        rng = random.Random(self.seed)
        return [rng.uniform(0, self.max_wait_ms / 1000) for _ in range(self.messages)]


@dataclass
class ParallelFigures:
    sizes: ParallelSizes
    #: Each run's drains, one per round.
    runs: dict[str, list[Drain]] = field(default_factory=dict)
    #: The shape's floor with unlimited fetch speed and free CPU, per ordering.
    floors_s: dict[str, float] = field(default_factory=dict)
    #: Python alone on the same waits (no Kafka, no kmq), seconds per round: the floor this
    #: interpreter sets on this machine (:mod:`~kmq_dagster.bench.parallel_bare`).
    python_alone_s: dict[str, list[float]] = field(default_factory=dict)
    #: kmq's thread runner with no worker loop around it, seconds per round, per ordering
    #: (:mod:`~kmq_dagster.bench.parallel_runner_alone`).
    runner_alone_s: dict[str, list[float]] = field(default_factory=dict)
    #: The backlog run's memory, when asked for.
    rss: RssFigures | None = None

    def seconds(self, name: str) -> float:
        return statistics.median(d.seconds for d in self.runs[name])

    def rate(self, name: str) -> float:
        return statistics.median(d.msgs_per_s for d in self.runs[name])

    def cpu_share(self, name: str) -> float:
        """CPU seconds per wall second while timed: 2.0 would be both cores busy."""
        return statistics.median(d.cpu_s / d.seconds for d in self.runs[name] if d.seconds)

    def end_markers_per_1000(self, name: str) -> float:
        """End markers written per 1,000 messages acknowledged (median of the rounds): one
        per run of offsets acknowledged together, so calls ending out of order write more."""
        return statistics.median(1000 * d.end_markers / d.acked for d in self.runs[name] if d.acked)

    def handled(self, name: str) -> int:
        """The fewest messages handled and acknowledged in any round of ``name``."""
        return min(min(d.handled, d.acked) for d in self.runs[name])

    def table(self) -> list[str]:
        lines = [
            f"{'run':<22} {'median':>10} {'rounds':>26} {'floor':>8} {'cpu/wall':>8} "
            f"{'Parallel Consumer':>18}"
        ]
        for name in SHAPES:
            rounds = " / ".join(f"{d.seconds:.2f}" for d in self.runs[name])
            pc = PARALLEL_CONSUMER_S.get(name)
            lines.append(
                f"{name:<22} {self.seconds(name):>8.2f} s {rounds:>26} "
                f"{self.floors_s[name.removeprefix('async_')]:>6.2f} s "
                f"{self.cpu_share(name):>8.2f} {f'{pc} s' if pc else '':>18}"
            )
        for name in ("io", *NO_OP_RUNS):
            rounds = " / ".join(f"{d.msgs_per_s / 1000:.1f}k" for d in self.runs[name])
            lines.append(
                f"{name:<22} {self.rate(name) / 1000:>6.1f}k/s {rounds:>26} {'':>8} "
                f"{self.cpu_share(name):>8.2f}"
            )
        lines.append(
            "end markers per 1,000 messages: "
            + ", ".join(f"{name} {self.end_markers_per_1000(name):.0f}" for name in self.runs)
        )
        alone = self.python_alone()
        lines.append(
            "python alone, same waits (no Kafka, no kmq): threads key "
            f"{alone['threads_key']:.2f} s, unordered {alone['threads_unordered']:.2f} s; asyncio "
            f"key {alone['asyncio_key']:.2f} s, unordered {alone['asyncio_unordered']:.2f} s; "
            f"the I/O run's awaits {self.io_python_alone_rate() / 1000:.1f}k/s"
        )
        runner = self.runner_alone()
        lines.append(
            "kmq's thread runner alone, same waits (no Kafka, no worker loop; each key one run): "
            f"key {runner['key']:.2f} s, unordered {runner['unordered']:.2f} s"
        )
        if self.rss is not None:
            rss = self.rss
            lines.append(
                f"worker RSS draining {rss.messages:,}: {rss.start_mb:.0f} MB at the start, "
                f"peak {rss.peak_mb:.0f} MB, {rss.end_mb:.0f} MB at the end; second half "
                f"{rss.second_half_slope_mb_per_min:+.2f} MB/min ({len(rss.samples)} samples, "
                f"{rss.drain.msgs_per_s:,.0f} msg/s)"
            )
            lines.append(
                "worker RSS, MB, every 5 s: "
                + " ".join(f"{mb:.0f}" for _, mb in rss.samples[:: round(5 / SAMPLE_EVERY_S)])
            )
        return lines

    def python_alone(self) -> dict[str, float]:
        """Median seconds of each of Python's own runs."""
        return _medians(self.python_alone_s)

    def runner_alone(self) -> dict[str, float]:
        """Median seconds of the thread runner's own runs, per ordering."""
        return _medians(self.runner_alone_s)

    def io_python_alone_rate(self) -> float:
        return self.sizes.io_messages / self.python_alone()["asyncio_io"]

    def as_json(self) -> str:
        figures: dict[str, Any] = {
            f"seconds_{name}": round(self.seconds(name), 3) for name in SHAPES
        }
        serial, direct = self.rate("noop_n1"), self.rate("noop_n1_direct")
        figures |= {
            "io_msgs_per_s": round(self.rate("io")),
            "noop_n1_msgs_per_s": round(serial),
            "noop_n1_direct_msgs_per_s": round(direct),
            "noop_n1_ratio": round(serial / direct, 3) if direct else 0.0,
            "noop_concurrent_loop_msgs_per_s": round(self.rate("noop_concurrent_loop")),
            "floor_seconds": {name: round(s, 3) for name, s in self.floors_s.items()},
            "python_alone_seconds": {
                name: round(seconds, 3) for name, seconds in self.python_alone().items()
            },
            "thread_runner_alone_seconds": {
                name: round(seconds, 3) for name, seconds in self.runner_alone().items()
            },
            "io_python_alone_msgs_per_s": round(self.io_python_alone_rate()),
            "cpu_per_wall": {name: round(self.cpu_share(name), 2) for name in self.runs},
            "end_markers_per_1000_msgs": {
                name: round(self.end_markers_per_1000(name), 1) for name in self.runs
            },
            "handled": {name: self.handled(name) for name in self.runs},
            "messages": {name: self._messages(name) for name in self.runs},
            "concurrency": self.sizes.concurrency,
            "rounds": self.sizes.rounds,
        }
        if self.rss is not None:
            figures |= self.rss.as_dict()
        return json.dumps(figures)

    def _messages(self, name: str) -> int:
        if name == "io":
            return self.sizes.io_messages
        if name == "noop_concurrent_loop":
            return self.sizes.noop_concurrent_messages
        return self.sizes.noop_messages if name in NO_OP_RUNS else self.sizes.messages


def shape_floors_s(waits_s: list[float], keys: int, concurrency: int) -> dict[str, float]:
    """Seconds of waiting no worker can avoid: partition order waits every message in turn,
    key order the longest key's messages in turn, unordered the total spread over N calls."""
    per_key = [sum(waits_s[k::keys]) for k in range(keys)]
    total = sum(waits_s)
    return {
        "partition": total,
        "key": max(*per_key, total / concurrency),
        "unordered": max(total / concurrency, *waits_s),
    }


def run_parallel_benchmark(
    cluster: Cluster, sizes: ParallelSizes, report: Report, *, rss_backlog: int = 0
) -> ParallelFigures:
    """Every run of ``kmq bench parallel``, ``sizes.rounds`` times; then, with ``rss_backlog``,
    the worker's memory while that many messages drain (once)."""
    waits_s = sizes.waits_s()
    figures = ParallelFigures(
        sizes, floors_s=shape_floors_s(waits_s, sizes.keys, sizes.concurrency)
    )
    plan = _plan(sizes, waits_s)
    for round_number in range(1, sizes.rounds + 1):
        # No run may profit from always going first on a fresh broker.
        order = rotated(list(SHAPES), round_number) + rotated(
            [name for name in plan if name not in SHAPES], round_number
        )
        for name in order:
            with cluster() as settings:  # a fresh broker each: its speed depends on its load
                drain = plan[name](settings)
            figures.runs.setdefault(name, []).append(drain)
            report(
                f"round {round_number}/{sizes.rounds}: {name:<20} {drain.seconds:7.2f} s "
                f"({drain.msgs_per_s:,.0f} msg/s, handled {drain.handled:,}, "
                f"acked {drain.acked:,}, cpu {drain.cpu_s:.2f} s)"
            )
        for name, measure in _python_alone(sizes, waits_s).items():
            figures.python_alone_s.setdefault(name, []).append(measure())
            report(
                f"round {round_number}/{sizes.rounds}: python alone, {name:<17} "
                f"{figures.python_alone_s[name][-1]:7.2f} s"
            )
        for name, keyed in (("key", True), ("unordered", False)):
            seconds = runner_threads_s(waits_s, sizes.keys, sizes.concurrency, keyed=keyed)
            figures.runner_alone_s.setdefault(name, []).append(seconds)
            report(
                f"round {round_number}/{sizes.rounds}: kmq's thread runner alone, {name:<9} "
                f"{seconds:7.2f} s"
            )
    if rss_backlog:
        with cluster() as settings:
            figures.rss = drain_with_rss(settings, rss_backlog, report)
    return figures


def _medians(rounds: dict[str, list[float]]) -> dict[str, float]:
    """The median of each name's rounds."""
    return {name: statistics.median(values) for name, values in rounds.items()}


def _python_alone(sizes: ParallelSizes, waits_s: list[float]) -> dict[str, Callable[[], float]]:
    """Python's own runs of the shape's waits and of the I/O run's, by name."""
    keys, concurrency = sizes.keys, sizes.concurrency
    io_waits_s = [sizes.io_wait_ms / 1000] * sizes.io_messages
    return {
        "threads_key": lambda: bare_threads_s(waits_s, keys, concurrency, keyed=True),
        "threads_unordered": lambda: bare_threads_s(waits_s, keys, concurrency, keyed=False),
        "asyncio_key": lambda: bare_asyncio_s(waits_s, keys, concurrency, keyed=True),
        "asyncio_unordered": lambda: bare_asyncio_s(waits_s, keys, concurrency, keyed=False),
        "asyncio_io": lambda: bare_asyncio_s(io_waits_s, keys, sizes.io_concurrency, keyed=False),
    }


def _plan(sizes: ParallelSizes, waits_s: list[float]) -> dict[str, Callable[[KmqSettings], Drain]]:
    """Every run by name: fill a fresh queue, then drain it through a Worker."""

    def shape(ordering: Ordering, use_async: bool) -> Callable[[KmqSettings], Drain]:
        handler: Callable[[CallLog], Handler] = (
            (lambda calls: awaiting(calls, waits_s.__getitem__))
            if use_async
            else (lambda calls: sleeping(calls, waits_s.__getitem__))
        )

        def run(settings: KmqSettings) -> Drain:
            opened = filled_queue(settings, sizes.messages, sizes.keys, partitions=1)
            return timed_drain(
                opened, sizes.messages, handler, concurrency=sizes.concurrency, ordering=ordering
            )

        return run

    def io_wait_s(_index: int) -> float:
        return sizes.io_wait_ms / 1000

    def io(settings: KmqSettings) -> Drain:
        opened = filled_queue(settings, sizes.io_messages, sizes.keys, sizes.io_partitions)
        return timed_drain(
            opened,
            sizes.io_messages,
            lambda calls: awaiting(calls, io_wait_s),
            concurrency=sizes.io_concurrency,
            ordering=Ordering.UNORDERED,
        )

    def noop(concurrency: int, direct_call: bool) -> Callable[[KmqSettings], Drain]:
        messages = sizes.noop_messages if concurrency == 1 else sizes.noop_concurrent_messages

        def run(settings: KmqSettings) -> Drain:
            opened = filled_queue(settings, messages, sizes.keys, partitions=1)
            # concurrency 2 in partition order on one partition: one call at a time, but
            # through the loop at concurrency 2 and its handler threads.
            return timed_drain(
                opened,
                messages,
                no_op,
                concurrency=concurrency,
                ordering=Ordering.PARTITION,
                direct_call=direct_call,
            )

        return run

    plan = {name: shape(ordering, use_async) for name, (ordering, use_async) in SHAPES.items()}
    plan["io"] = io
    plan["noop_n1"] = noop(1, direct_call=False)
    plan["noop_n1_direct"] = noop(1, direct_call=True)
    plan["noop_concurrent_loop"] = noop(2, direct_call=False)
    return plan
