"""The worker loop: ``N`` handler calls at once, in a chosen order (invariants 10, 11), for
every ``N``, 1 included.

One thread, the loop, polls the consumer, buffers what it fetched in a
:class:`~kmq_dagster.core.ordering.LaneScheduler`, starts what the ordering lets start on a
runner, and handles the calls' ends; only it touches the scheduler, the router and the breaker.
At ``N`` = 1 the runner is an :class:`~kmq_dagster.worker.handler_runner.InlineRunner`: each
call runs on the loop's own thread, one at a time in fetch order per partition, and its end is
handled before the next call starts. While nothing waits in the scheduler (no retry in place,
nothing held for the breaker), a fetch runs *straight*: in fetch order, which keeps every
ordering when calls run one at a time, without entering the scheduler (its bookkeeping tripled
the CPU per message); the first message that needs the scheduler, and all after it, go there.
Above 1 it is a :class:`~kmq_dagster.worker.handler_runner.ThreadRunner` (threads) for a sync
handler, and an :class:`~kmq_dagster.worker.handler_runner.EventLoopRunner` for an ``async def``
one (tasks on an event loop that this thread runs while it waits for ends).

With threads and no breaker, the loop hands out *runs*: each lane that may start gives all it
holds (a key's, or a partition's, messages in offset order), and one thread calls them in turn
(in ``unordered`` order each message is a run of its own, handed over without a run object), so
a key's next message starts without a round trip through this loop; up to ``2 * N`` runs are
handed out, the ones no thread has taken yet waiting on the runner's queue. Messages fetched
for a lane while its run goes join that run (in ``key`` and ``partition`` order), so its thread
calls them next, without a round trip through this loop; a run its thread has just finished
takes none (they start as the lane's next run). A run stops at its first call that does not
return (the rest comes back to its lane's head, behind the failed one's retry) and once the
worker stops (the rest is left for redelivery). Its messages count as held for the memory bound
(fetching pauses at ``max_buffered`` + ``N`` held), and their waits are measured as they start.
With a breaker, calls start one at a time as before; with ``extend_running`` off, one message
at a time per lane.

* Returned: acknowledged. Raised, ``unordered`` or ``partition``: copied to its retry topic (or
  the DLQ), acknowledged once the copy is durable, redelivered now if the copy failed.
  Raised, ``key``: retried *in place* after the policy's delay for that attempt, at the head of
  its key's lane, so the key's later messages wait for it; once the policy gives up it goes to
  the DLQ with its reason. Fatal errors and corrupt retry headers go to the DLQ in every order.
* Bounded memory: fetching pauses while ``max_buffered`` messages wait to start (one fetch
  already under way may still come in on top: :class:`~kmq_dagster.worker.worker.Worker` caps
  its size at ``max_buffered``).
* Visibility: every third of the visibility timeout every message held (waiting, waiting for
  its retry in place, or running) is extended, so none expires while the worker lives. At
  ``N`` = 1 the loop's thread runs the call, so nothing is extended while a call runs: a call
  that outlives the visibility timeout is redelivered while it runs (as ``extend_running``
  ``False`` does above 1), and so may the messages waiting behind it. After
  a crash the tracker redelivers them once their timeout runs out. Ordering holds within one
  worker's life only: redelivered copies and retry-topic copies come from other topics and are
  not ordered against their originals, so ``key`` order through a crash or a rebalance is not
  kept.
* Tracing: above 1, each call's ``process`` span carries ``kmq.ordering.wait_ms``, the ms
  from its message's fetch to its first call (a retry in place waits its delay: not counted).
* Stop: fetching and starting stop; calls running get up to ``drain_timeout_s`` to end (ended
  ones are acknowledged or routed); the rest are left unacknowledged, for redelivery.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kmq_dagster.core.breaker import GroupBreaker, State
from kmq_dagster.core.ordering import LaneScheduler, Ordering
from kmq_dagster.core.retry import DeadLetter
from kmq_dagster.core.retry_headers import Failure, read_attempt, read_first_failure_ms
from kmq_dagster.core.wait_histogram import WaitHistogram
from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.kafka.retry_router import GiveUp, RetryRouter, failure_of, logged_error_text
from kmq_dagster.tracing import ORDERING_WAIT_MS, tracing_active
from kmq_dagster.worker.deadline_alarm import EveryMessage, alarm_for
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import (
    CallEnd,
    EventLoopRunner,
    InlineRunner,
    Run,
    RunJob,
    ThreadRunner,
    Unstarted,
    concurrent_runner,
)
from kmq_dagster.worker.loop_types import LoopConsumer, WorkerStats

log = logging.getLogger(__name__)

#: A failed message and what its copy says (a DLQ reason for ``str`` and :class:`GiveUp`).
ToRoute = tuple[KmqMessage, Failure | str | GiveUp]


@dataclass(frozen=True)
class InPlace:
    """A message retried in place: its attempts so far, and when it first failed."""

    attempt: int
    first_failure_ms: int


#: Longest wait for a call's end before the loop polls (and extends) again.
END_WAIT_S = 0.05
#: Runs handed to a thread runner per thread: while some run, the rest wait on its queue, so a
#: thread that ends one starts the next at once.
RUNS_QUEUED_PER_THREAD = 2
#: Calls handed to an event loop runner per call slot: as many again as slots wait there, so a
#: call that ends is followed at once by the next (not with a breaker, whose calls start one
#: at a time, nor when only waiting messages are extended: a handed-over call may wait).
CALLS_HANDED_PER_SLOT = 2


def default_max_buffered(concurrency: int) -> int:
    """Messages buffered before fetching pauses: ``max(4 * concurrency, 100)``."""
    return max(4 * concurrency, 100)


class WorkerLoop:
    """A worker's steps with up to ``concurrency`` calls at once, on any :class:`LoopConsumer`."""

    def __init__(
        self,
        consumer: LoopConsumer,
        handler: HandlerCall,
        stop: threading.Event,
        *,
        router: RetryRouter,
        breaker: GroupBreaker | None,
        clock_ms: Callable[[], int],
        concurrency: int,
        ordering: Ordering = Ordering.PARTITION,
        max_buffered: int | None = None,
        extend_running: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        self.consumer = consumer
        #: Running calls are extended too (default); off, a call that outlives the visibility
        #: timeout is redelivered while it runs (messages waiting to start are always kept).
        self.extend_running = extend_running
        #: Messages whose call is running now.
        self._running: set[KmqMessage] = set()
        self.stop = stop
        self.router = router
        self.breaker = breaker
        self.clock_ms = clock_ms
        self.ordering = Ordering(ordering)
        self.max_buffered = max_buffered or default_max_buffered(concurrency)
        self.concurrency = concurrency
        #: Waits from fetch to call start: at 1 a call starts when the one before it ends.
        self.stats = WorkerStats(waits=WaitHistogram() if concurrency > 1 else None)
        self.runner: InlineRunner | ThreadRunner | EventLoopRunner = (
            InlineRunner(handler)
            if concurrency == 1
            else concurrent_runner(
                handler, concurrency, clock_ms=clock_ms, stop=stop, waits=self.stats.waits
            )
        )
        #: Threads take a lane's queue as one run, and runs wait on the runner's queue for a
        #: free thread: no round trip through this loop between two calls. Not with a breaker
        #: (its calls start one at a time), nor when only waiting messages are extended (a
        #: run's messages are all in flight).
        self._run_runner = (
            self.runner
            if isinstance(self.runner, ThreadRunner) and breaker is None and extend_running
            else None
        )
        #: Messages fetched for a lane whose run is going join that run (only where a lane
        #: can hold more than one message: not ``unordered``).
        self._joinable_runs = (
            self._run_runner is not None and self.ordering is not Ordering.UNORDERED
        )
        #: Messages of runs that must not start (the threads read it): see :meth:`_add`.
        self._cancelled: set[KmqMessage] = (
            self.runner.cancelled
            if isinstance(self.runner, ThreadRunner | EventLoopRunner)
            else set()
        )
        #: Calls handed to the event loop beyond its slots wait there for one (it observes
        #: their waits as they start).
        self._calls_wait_for_slots = (
            isinstance(self.runner, EventLoopRunner) and breaker is None and extend_running
        )
        handed = (
            RUNS_QUEUED_PER_THREAD
            if self._run_runner
            else CALLS_HANDED_PER_SLOT
            if self._calls_wait_for_slots
            else 1
        )
        self.scheduler: LaneScheduler[KmqMessage] = LaneScheduler(
            self.ordering, handed * concurrency
        )
        #: When the straight path's calls must stop to extend what waits behind them.
        self._alarm = (
            alarm_for(clock_ms, thread_name="kmq-extension-alarm")
            if self.runner.inline
            else EveryMessage()
        )
        #: The extension deadline (clock ms) the alarm was last armed for.
        self._alarm_set_for_ms = -1
        self.exit_code: int | None = None
        #: Every message held (waiting or running): what visibility extensions cover.
        self._held: dict[KmqMessage, None] = {}
        #: Messages of fetches that may carry retry metadata (headers, or a retry topic): their
        #: metadata is checked as they start; no other message can carry any.
        self._suspects: set[KmqMessage] = set()
        #: When each message waiting for its first call was fetched (for the wait metric).
        self._fetched_at_ms: dict[KmqMessage, int] = {}
        #: Messages retried in place: attempts so far (its headers' attempt first) and when
        #: it first failed (what its DLQ copy records if the retries run out).
        self._in_place: dict[KmqMessage, InPlace] = {}
        self._rng = rng or random.Random()
        self._extended_at_ms = clock_ms()
        #: Whether the breaker allowed processing at this step's start.
        self._allowed = True

    def step(self) -> None:
        """Fetch if there is room, start what may start, handle the calls that ended."""
        now_ms = self.clock_ms()
        self._allowed = self.breaker is None or self.breaker.allows(now_ms)
        scheduler = self.scheduler
        # Runs take messages in flight before their calls: all held count too (invariant 11).
        full = (
            scheduler.buffered >= self.max_buffered
            or scheduler.holding >= self.max_buffered + self.concurrency
        )
        self.consumer.hold_fetching(full or not self._allowed)
        # Nothing running: nothing can start either (it would have at the end of the last
        # step) until a message comes or a retry in place is due, so the poll may wait.
        idle = self.scheduler.in_flight == 0
        fetched = self.consumer.poll(timeout_s=self._until_due_s(0.5) if idle else 0.0)
        fetched_ms = self.clock_ms()  # one read per fetch: its messages came in together
        if fetched and self.runner.inline and not self.scheduler.holds_any:
            fetched = self._run_straight(fetched, fetched_ms)
        self._add_all(fetched, fetched_ms)
        self._start(fetched_ms)
        self._handle_ends(self._wait_for_ends(END_WAIT_S))
        # Calls that ended free their lanes: start what waits now, not after a fetch's wait
        # (in partition order every message waited 0.5 s on the next poll otherwise).
        if self._allowed:
            self._start(self.clock_ms())
        self._keep_visible()
        self._count_held()

    def drain(self, timeout_s: float) -> None:
        """After ``stop``: start nothing more, wait up to ``timeout_s`` for running calls and
        handle their ends; leave everything else unacknowledged, then stop the runner."""
        self.consumer.hold_fetching(True)
        if self.scheduler.in_flight:
            log.info(
                "stopping: waiting up to %g s for %d calls running", timeout_s,
                self._calls_running(),
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while self.scheduler.in_flight and (left := deadline - time.monotonic()) > 0:
            self._handle_ends(self._wait_for_ends(min(left, END_WAIT_S)))
            # Stay in the group and write acks; what comes was fetched before the hold: never
            # started.
            self._add_all(self.consumer.poll(timeout_s=0.0), self.clock_ms())
            self._keep_visible()
            self._count_held()
        if self.scheduler.in_flight:
            log.warning("%d calls still running; left for redelivery", self._calls_running())
        self.close()

    def close(self) -> None:
        """Stop the runner and the alarm (after :meth:`drain`, or an error in :meth:`step`)."""
        self.runner.close()
        self._alarm.close()

    def _add_all(self, fetched: list[KmqMessage], fetched_ms: int) -> None:
        """Buffer a fetch's messages (one bookkeeping pass for the fetch, not per message)."""
        add = self.scheduler.add
        keyed = self.ordering is Ordering.KEY  # no other ordering reads a key
        for index, message in enumerate(fetched):
            # The record's own methods, not the view's properties: no Python frame for each
            # (N = 100, threads: 4.8% of the loop's instructions a message; stop 59).
            record = message.record
            try:
                key = record.key() if keyed else None
                source = (record.topic() or "", record.partition() or 0)
                add(message, source, record.offset() or 0, key)
            except ValueError:  # fetched again from an earlier offset: rare, one at a time
                self._held.update(dict.fromkeys(fetched[:index]))
                self._fetched_at_ms.update(dict.fromkeys(fetched[:index], fetched_ms))
                for rest in fetched[index:]:
                    self._add(rest, fetched_ms)
                return
        self._held.update(dict.fromkeys(fetched))
        self._fetched_at_ms.update(dict.fromkeys(fetched, fetched_ms))
        if self.consumer.fetch_has_metadata:
            self._suspects.update(fetched)

    def _add(self, message: KmqMessage, fetched_ms: int) -> None:
        source = (message.topic, message.partition)
        try:
            self.scheduler.add(message, source, message.offset, message.key)
        except ValueError:
            # Fetched again from an earlier offset (partition reassigned): what waits of the
            # source is left for redelivery, the new copies are ordered afresh; so is what a
            # run of it, or an event loop's call waiting for a slot, has not started yet.
            if self._run_runner is not None or self._calls_wait_for_slots:
                self._cancelled.update(self.scheduler.in_flight_of([source]))
            for dropped in self.scheduler.forget([source]):
                self._drop(dropped)
            self.scheduler.add(message, source, message.offset, message.key)
        self._held[message] = None
        self._fetched_at_ms[message] = fetched_ms
        if self.consumer.fetch_has_metadata:
            self._suspects.add(message)

    def _run_straight(self, fetched: list[KmqMessage], fetched_ms: int) -> list[KmqMessage]:
        """One call at a time with nothing waiting: run the fetch's calls in fetch order, which
        keeps every ordering, without lanes; return the rest once a call needs the scheduler.

        A call that returned is acknowledged here. The first message that cannot simply run
        (the stop is set, the breaker holds, its retry headers are corrupt) and every message
        after it are returned to be buffered as usual; a failed call's end is handled by the
        scheduler's path too (its message enters it as the call in flight), so a retry in
        place or a held probe makes the rest of the fetch wait behind it (routed to a retry
        topic, it holds nothing up).
        """
        consumer, stats, breaker, clock_ms = self.consumer, self.stats, self.breaker, self.clock_ms
        stop = self.stop
        # A threading.Event's own flag is read in place: is_set() is a Python call per message
        # (about 2% of a no-op call's CPU). Any other event is asked.
        flag_readable = type(stop) is threading.Event and hasattr(stop, "_flag")
        ack = consumer.acknowledger()
        alarm = self._alarm
        rung = alarm.rung  # non-empty once the extension is due (always, on a test's clock)
        call, settle = self.runner.handler.hot_call()
        # A fetch without headers and without retry-topic records has no retry metadata to
        # check (the common case: one check per fetch, not a header read per message).
        metadata_problem = self.router.metadata_problem if consumer.fetch_has_metadata else None
        visibility_ms = consumer.visibility_timeout_ms
        third_ms = visibility_ms // 3
        extend_at_ms = self._extended_at_ms + third_ms
        if extend_at_ms != self._alarm_set_for_ms:
            # Once a deadline, not once a fetch: arming takes the alarm's lock, and it woke the
            # alarm's thread about every other fetch (the same deadline, recomputed on another
            # clock, came out a hair sooner). A no-op handler's worker ran 5-8% faster without.
            # Rung meanwhile, the alarm stays rung until a call below re-arms it.
            alarm.arm(extend_at_ms - fetched_ms)
            self._alarm_set_for_ms = extend_at_ms
        # Read by ``kmq worker``'s stop deadline: a call runs, or is about to, until this
        # returns (between two calls the loop only acknowledges, and extends once rung).
        stats.calls_in_flight = 1
        # One test per message for both rare checks (a worker without a breaker on a fetch
        # without metadata makes none), and no index kept: the few exits that need the
        # message's place look it up. Together about 2% of a message's CPU (instructions
        # counted, docs/benchmarks.md, stop 58).
        checked = breaker is not None or metadata_problem is not None
        try:
            for message in fetched:
                if stop._flag if flag_readable else stop.is_set():  # type: ignore[attr-defined]
                    return fetched[fetched.index(message) :]  # buffered, not started
                if checked:
                    if breaker is not None and not breaker.allows(clock_ms()):
                        return fetched[fetched.index(message) :]  # redelivered if never run
                    if metadata_problem is not None and metadata_problem(message) is not None:
                        return fetched[fetched.index(message) :]  # to the DLQ by the scheduler
                    if breaker is not None:
                        breaker.started()
                try:
                    result = call(message)
                    if result is not None:
                        settle(result)
                except BaseException as exc:  # every end but a return: the one after-call path
                    if not self._handle_failure(message, exc, fetched_ms):
                        # retried in place, or held for the breaker
                        return fetched[fetched.index(message) + 1 :]
                    stats.calls_in_flight = 1
                    continue  # routed to its retry topic (or the DLQ): nothing waits for it
                ack(message)
                stats.handled += 1
                if breaker is not None:
                    breaker.record(True, clock_ms())
                if rung:
                    now_ms = clock_ms()
                    if now_ms >= extend_at_ms:
                        # The rest of the fetch waits for this thread: keep it from being
                        # redelivered.
                        for waiting in fetched[fetched.index(message) + 1 :]:
                            consumer.extend(waiting, visibility_ms / 1000)
                        self._extended_at_ms = now_ms
                        extend_at_ms = now_ms + third_ms
                    alarm.arm(extend_at_ms - now_ms)
                    self._alarm_set_for_ms = extend_at_ms
            return []
        finally:
            stats.calls_in_flight = 0

    def _handle_failure(self, message: KmqMessage, exc: BaseException, fetched_ms: int) -> bool:
        """A straight call that did not return: its end takes the scheduler's path (its message
        enters it as the call in flight). Returns whether the rest of the fetch may go on
        straight (False: it was retried in place, or held for the breaker, and the rest waits
        behind it)."""
        self.stats.calls_in_flight = 0
        self._add(message, fetched_ms)
        self._fetched_at_ms.pop(message)  # started: a retry in place waits its delay
        self.scheduler.take(self.clock_ms(), 1)  # the only message: now in flight
        self._handle_ends([CallEnd(message, exc)])
        return not self.scheduler.holds_any

    def _start(self, now_ms: int) -> None:
        self._start_calls(now_ms)
        self.runner.begin()  # an event loop starts what was submitted now, not at the next wait

    def _start_calls(self, now_ms: int) -> None:
        # With a breaker, one at a time: a half-open breaker allows a single probe.
        if (runner := self._run_runner) is not None:
            if self.stop.is_set():
                return
            if self.ordering is Ordering.UNORDERED:
                # Every lane holds one message (a duplicate of one in flight waits behind it):
                # runs of one, handed over together.
                self._submit_singles(runner, self.scheduler.take(now_ms))
                return
            if self._joinable_runs:
                self._join_runs(runner)
            for run in self.scheduler.take_runs(now_ms):
                self._submit_run(runner, run)
            return
        limit = None if self.breaker is None else 1
        inline = self.runner.inline
        traced = tracing_active()
        while not self.stop.is_set() and (self.breaker is None or self.breaker.allows(now_ms)):
            taken = self.scheduler.take(now_ms, limit)
            if not taken:
                return
            if not inline:
                self._submit(taken, traced, now_ms)
                continue
            # Read by ``kmq worker``'s stop deadline while the call runs on this thread.
            self.stats.calls_in_flight = 1
            self._submit(taken, traced, now_ms)
            # The call has ended: handle it (ack, route, breaker) before the next starts, so
            # the whole fetch runs in this step, one message at a time.
            self._handle_ends(self.runner.take_ends(0.0))
            self.stats.calls_in_flight = 0
            now_ms = self.clock_ms()
            self._keep_visible(now_ms)

    def _submit(self, taken: list[KmqMessage], traced: bool, now_ms: int) -> None:
        breaker, suspects, waits = self.breaker, self._suspects, self.stats.waits
        fetched_at_of, running, submit = self._fetched_at_ms.pop, self._running, self.runner.submit
        # An event loop observes each call's wait as the call starts (it may wait for a slot).
        on_loop = self.runner if isinstance(self.runner, EventLoopRunner) else None
        # First starts' waits, observed together (above 1: at 1 a call waits for the last).
        started_waits_s: list[float] = []
        for message in taken:
            if suspects and message in suspects:
                problem = self.router.metadata_problem(message)
                if problem is not None:
                    self._route([(message, problem)])
                    continue
            if breaker is not None:
                breaker.started()
            attributes = None
            fetched_at_ms = fetched_at_of(message, None)
            if on_loop is not None:
                running.add(message)
                on_loop.submit(message, None, fetched_at_ms)
                continue
            if fetched_at_ms is not None and waits is not None:
                # First start only: a retry in place waits its delay.
                wait_ms = max(0, now_ms - fetched_at_ms)
                started_waits_s.append(wait_ms / 1000)
                if traced:
                    attributes = {ORDERING_WAIT_MS: wait_ms}
            running.add(message)
            submit(message, attributes)
        if waits is not None and started_waits_s:
            waits.observe_all(started_waits_s)

    def _submit_run(self, runner: ThreadRunner, run: list[KmqMessage]) -> None:
        """Hand ``run`` to ``runner``'s threads; a message whose retry headers are corrupt goes
        to the DLQ in its turn: at the run's head now, or, further in, given back to wait for
        the calls before it."""
        problem_of, fetched_at_ms = self.router.metadata_problem, self._fetched_at_ms
        suspects = self._suspects
        jobs: list[RunJob] = []
        for index, message in enumerate(run):
            problem = problem_of(message) if suspects and message in suspects else None
            if problem is None:
                jobs.append((message, fetched_at_ms.get(message)))
            elif jobs:
                self.scheduler.give_back(run[index:])
                break
            else:
                self._route([(message, problem)])  # its run's next message is the head now
        if jobs:
            handle = runner.submit_run(jobs, joinable=self._joinable_runs)
            if self._joinable_runs:
                self.scheduler.tag_run(jobs[0][0], handle)

    def _submit_singles(self, runner: ThreadRunner, taken: list[KmqMessage]) -> None:
        """Hand each of ``taken`` to ``runner``'s threads as a run of its own; one whose retry
        headers are corrupt goes to the DLQ instead."""
        fetched_at_ms = self._fetched_at_ms
        if self._suspects:
            problem_of, suspects = self.router.metadata_problem, self._suspects
            routed: list[ToRoute] = [
                (message, problem)
                for message in taken
                if message in suspects and (problem := problem_of(message)) is not None
            ]
            if routed:
                self._route(routed)
                gone = {message for message, _ in routed}
                taken = [message for message in taken if message not in gone]
        runner.submit_singles([(message, fetched_at_ms.get(message)) for message in taken])

    def _join_runs(self, runner: ThreadRunner) -> None:
        """Messages fetched for a lane whose run is still going join that run: its thread
        calls them next, with no round trip through this loop (key order on Parallel
        Consumer's shape: 6-11 ms between a key's runs, a fifth of a drain). A run its
        thread has just finished takes none: they wait in the lane for its end, as before;
        nor does one from a message with corrupt retry headers on (it goes to the DLQ in its
        turn, as the head of a run of its own)."""
        fetched_at_ms, suspects = self._fetched_at_ms, self._suspects
        for handle, waiting in self.scheduler.grown_runs():
            joining = self._before_corrupt(waiting) if suspects else waiting
            if not joining or not isinstance(handle, Run):
                continue
            if runner.extend_run(handle, [(m, fetched_at_ms.get(m)) for m in joining]):
                self.scheduler.extend_run(joining)

    def _before_corrupt(self, messages: list[KmqMessage]) -> list[KmqMessage]:
        """``messages`` up to the first whose retry headers are corrupt."""
        suspects, problem_of = self._suspects, self.router.metadata_problem
        for index, message in enumerate(messages):
            if message in suspects and problem_of(message) is not None:
                return messages[:index]
        return messages

    def _wait_for_ends(self, timeout_s: float) -> Sequence[CallEnd | Unstarted]:
        if not self.scheduler.in_flight:
            return []
        return self.runner.take_ends(self._until_due_s(timeout_s))

    def _until_due_s(self, longest_s: float) -> float:
        due_ms = self.scheduler.next_due_ms()
        if due_ms is None or not self._allowed:  # nothing starts while the breaker is open
            return longest_s
        return max(0.0, min(longest_s, (due_ms - self.clock_ms()) / 1000))

    def _handle_ends(self, ends: Sequence[CallEnd | Unstarted]) -> None:
        failed: list[ToRoute] = []
        # Looked up once for the whole batch: this runs for every message.
        running, cancelled, stats = self._running, self._cancelled, self.stats
        breaker, ack = self.breaker, self.consumer.acknowledger()
        finish, drop = self.scheduler.finish, self._drop
        for end in ends:
            if isinstance(end, Unstarted):
                self._unstarted(end.messages)
                continue
            message, error = end.message, end.error
            running.discard(message)
            if cancelled:  # it had started: it was no longer to be stopped
                cancelled.discard(message)
            if end.first_call:  # its wait from fetch to start was observed by the thread
                del self._fetched_at_ms[message]
            if error is None:
                ack(message)
                stats.handled += 1
                if breaker is not None:
                    breaker.record(True, self.clock_ms())
                finish(message)
                drop(message)
            elif isinstance(error, KeyboardInterrupt | SystemExit):
                self._interrupted(message, error)
            else:  # any other BaseException (GeneratorExit, ...) fails the message too
                self._failed(message, error, failed)
        if failed:
            self._route(failed)

    def _unstarted(self, messages: list[KmqMessage]) -> None:
        """A run's end that never started (or a call handed to an event loop that the stop
        kept from starting): back in its lane, or left for redelivery if its partition was
        fetched again since."""
        for message in messages:
            self._running.discard(message)
        drop = messages[0] in self._cancelled
        self.scheduler.give_back(messages, drop=drop)
        if drop:
            for message in messages:
                self._cancelled.discard(message)
                self._drop(message)

    def _failed(self, message: KmqMessage, exc: BaseException, failed: list[ToRoute]) -> None:
        self.stats.failed += 1
        shown = logged_error_text(exc)
        log.info("handler failed on %r: %s: %s", message, type(exc).__name__, shown)
        now_ms = self.clock_ms()
        fatal = not self.router.policy.is_retryable(exc)
        if self.breaker is not None and fatal:
            self.breaker.release()
        elif self.breaker is not None:
            self.breaker.record(False, now_ms)
            if self.breaker.state is not State.CLOSED:
                # The outage, not the message: run it again once the breaker allows.
                self.scheduler.retry_in_place(message, now_ms)
                return
        if self.ordering is not Ordering.KEY or fatal:
            failed.append((message, failure_of(exc)))
            return
        # A copy from a retry topic carries its first failure (and attempt) in its headers.
        in_place = self._in_place.get(message) or InPlace(
            read_attempt(message.headers), read_first_failure_ms(message.headers, now_ms)
        )
        failure = failure_of(exc)
        decision = self.router.policy.after_failure(
            in_place.attempt, failure.error_type, now_ms, self._rng, failure.error_message
        )
        if isinstance(decision, DeadLetter):
            failed.append((message, GiveUp(failure, decision, in_place.first_failure_ms)))
            return
        self._in_place[message] = InPlace(decision.attempt, in_place.first_failure_ms)
        self.stats.retried_in_place += 1
        self.scheduler.retry_in_place(message, decision.due_ms)

    def _route(self, failed: list[ToRoute]) -> None:
        routed = self.router.route(failed)
        for message in routed:
            self.consumer.ack(message)
        for message, _ in failed:
            if all(message is not r for r in routed):
                self.consumer.nack(message)  # the copy failed: redeliver rather than lose it
            self._finish(message)

    def _interrupted(self, message: KmqMessage, error: BaseException) -> None:
        if isinstance(error, SystemExit):
            self.exit_code = error.code if isinstance(error.code, int) else 1
        log.warning("handler stopped the worker on %r; it will be redelivered", message)
        self.stop.set()
        self._finish(message)  # not acknowledged: redelivered after its visibility timeout

    def _finish(self, message: KmqMessage) -> None:
        self.scheduler.finish(message)
        self._drop(message)

    def _drop(self, message: KmqMessage) -> None:
        self._held.pop(message, None)
        self._fetched_at_ms.pop(message, None)
        if self._suspects:
            self._suspects.discard(message)
        if self._in_place:  # mostly empty: one check per message, not a lookup
            self._in_place.pop(message, None)

    def _count_held(self) -> None:
        self.stats.calls_in_flight = calls = self._calls_running()
        self.stats.held = self.scheduler.holding - calls

    def _calls_running(self) -> int:
        """Calls running now: a busy lane runs one (a run's later messages wait for it), and
        runs beyond the threads wait for one."""
        return min(self.scheduler.busy_lanes, self.concurrency)

    def _keep_visible(self, now_ms: int | None = None) -> None:
        now_ms = self.clock_ms() if now_ms is None else now_ms
        visibility_ms = self.consumer.visibility_timeout_ms
        if now_ms - self._extended_at_ms < visibility_ms // 3:
            return
        for message in self._held:
            if self.extend_running or message not in self._running:
                self.consumer.extend(message, visibility_ms / 1000)
        self._extended_at_ms = now_ms
