"""What every fault scenario sets up: a broker, a queue, its messages, and kmq processes.

A :class:`Scenario` owns a scratch folder, a :class:`~kmq_dagster.bench.fleet.Fleet` and a
``kmq broker`` on a free port (durable with ``durable=True``). Leaving its ``with`` block stops
every process it started, by PID.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kmq_dagster.bench import fault_handler
from kmq_dagster.bench.common import Report
from kmq_dagster.bench.fleet import BrokerRun, Fleet, KmqProcess
from kmq_dagster.bench.tally import Ledger
from kmq_dagster.broker.ports import free_port
from kmq_dagster.core.lifecycle import Service
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.errors import KmqError
from kmq_dagster.kafka.producer import KmqProducer
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.settings import KmqSettings

#: Session timeout of every process: the smallest Apache Kafka accepts by default.
SESSION_TIMEOUT_MS = 6_000
GROUP = "faults"
#: Set to keep a scenario's folder (logs, handler output, broker data) for a post-mortem.
KEEP_ENV = "KMQ_FAULT_KEEP"


class ScenarioError(KmqError):
    """A fault scenario could not run as designed (a process died that should have lived)."""


@dataclass(frozen=True)
class Workload:
    """The messages of a scenario and how its handler behaves."""

    messages: int
    partitions: int = 4
    #: Share of messages sent through the delay queue (due 1 to 3 s later).
    delayed_share: float = 0.0
    #: Share of messages that are poison (always fail, non-retryable: straight to the DLQ).
    poison_share: float = 0.0
    #: Share of handler calls that fail (retried).
    failure_rate: float = 0.0
    #: Milliseconds each handler call takes.
    work_ms: float = 0.0
    visibility_timeout_ms: int = 10_000
    max_redeliveries: int = 3
    retry_delays_ms: tuple[int, ...] = (1_000, 2_000)


class Scenario(Service):
    """One scenario's broker, queue, fleet and scratch folder."""

    def __init__(self, name: str, workload: Workload, report: Report, *, durable: bool = False):
        self.name = name
        self.workload = workload
        self.report = report
        self.dir = Path(tempfile.mkdtemp(prefix=f"kmq-fault-{name}-"))
        (self.dir / "out").mkdir()
        self.audit_url = f"sqlite:///{self.dir / 'audit.db'}"
        self.fleet = Fleet(
            self.dir,
            {
                "KMQ_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
                "KMQ_AUDIT_URL": self.audit_url,
                fault_handler.OUTPUT_DIR_ENV: str(self.dir / "out"),
                fault_handler.FAILURE_RATE_ENV: str(workload.failure_rate),
                fault_handler.WORK_MS_ENV: str(workload.work_ms),
            },
        )
        self.broker = BrokerRun(self.fleet, free_port(), self.dir / "data" if durable else None)
        self.fleet.env["KMQ_BOOTSTRAP_SERVERS"] = self.broker.bootstrap_servers
        self.settings = KmqSettings(
            bootstrap_servers=self.broker.bootstrap_servers, session_timeout_ms=SESSION_TIMEOUT_MS
        )
        self.queue = Queue(
            f"{name}-{uuid.uuid4().hex[:6]}",
            GROUP,
            partitions=workload.partitions,
            retry_policy=RetryPolicy.fixed(workload.retry_delays_ms),
            visibility_timeout_ms=workload.visibility_timeout_ms,
            max_redeliveries=workload.max_redeliveries,
        )
        self.ledger: Ledger | None = None

    def start(self) -> None:
        self.broker.start()
        report = provision_queue(self.settings, self.queue, delay_queue=True)
        self.queue = report.opened.queue  # with its auxiliary partition count

    def stop(self) -> None:
        self.fleet.stop_all()
        if os.environ.get(KEEP_ENV):
            self.report(f"{self.name}: logs and data kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- messages ---------------------------------------------------------------------------

    def send(self, rng: random.Random | None = None, spread_s: float = 0.0) -> Ledger:
        """Produce the workload's messages (some delayed, some poison), evenly over
        ``spread_s`` seconds (0: at once); returns their ledger."""
        rng = rng or random.Random(7)
        workload = self.workload
        producer = KmqProducer(self.settings)
        ids: list[bytes] = []
        began = time.monotonic()
        for index in range(workload.messages):
            if spread_s and index % 500 == 0:
                pause = began + spread_s * index / workload.messages - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            draw = rng.random()
            if draw < workload.poison_share:
                value = f"{fault_handler.POISON_PREFIX.decode()}-{index:07d}".encode()
                producer.send(self.queue.topic, value)
            elif draw < workload.poison_share + workload.delayed_share:
                value = f"delayed-{index:07d}".encode()
                producer.send(self.queue.topic, value, delay=rng.uniform(1.0, 3.0))
            else:
                value = f"m-{index:07d}".encode()
                producer.send(self.queue.topic, value)
            ids.append(value)
        if producer.flush():
            raise ScenarioError("the broker did not acknowledge every message sent")
        self.ledger = Ledger(self.settings, self.queue, self.dir / "out", ids)
        return self.ledger

    # -- processes --------------------------------------------------------------------------

    def queue_args(self) -> list[str]:
        return ["--topic", self.queue.topic, "--group", self.queue.group]

    def worker(self, *extra: str) -> KmqProcess:
        return self.fleet.start(
            "worker",
            "worker",
            *self.queue_args(),
            "--handler",
            fault_handler.HANDLER_SPEC,
            "--non-retryable",
            fault_handler.PoisonMessageError.__name__,
            *extra,
        )

    def tracker(self, *extra: str) -> KmqProcess:
        return self.fleet.start("tracker", "tracker", *self.queue_args(), *extra)

    def delayer(self) -> KmqProcess:
        return self.fleet.start("delayer", "delayer", "--topic", self.queue.topic)

    def require_alive(self, processes: list[KmqProcess]) -> None:
        """Raises :class:`ScenarioError` if any of ``processes`` exited."""
        dead = self.fleet.dead(processes)
        if dead:
            raise ScenarioError(f"{self.name}: " + "\n".join(dead))

    def wait_for_progress(self, share: float, timeout_s: float) -> None:
        """Wait until ``share`` of the messages sent were processed.

        Raises:
            ScenarioError: not within ``timeout_s``.
        """
        assert self.ledger is not None, "send() first"
        wanted = int(share * len(self.ledger.ids))
        deadline = time.monotonic() + timeout_s
        while len(self.ledger.processed()) < wanted:
            if time.monotonic() > deadline:
                raise ScenarioError(f"{self.name}: fewer than {wanted} processed in {timeout_s} s")
            time.sleep(0.1)


def progress_reporter(report: Report, name: str, every_s: float = 10.0) -> Callable[[int], None]:
    """A progress hook for :meth:`Ledger.wait_until_accounted` that reports every ``every_s``."""
    last = [time.monotonic()]

    def show(accounted: int) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            report(f"{name}: {accounted:,} accounted for")

    return show
