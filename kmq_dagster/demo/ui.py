"""``kmq demo --ui``: the demo queue operated from Dagster, with a scripted downstream outage.

Starts the embedded broker, provisions the demo queue, starts Dagster (webserver and daemon) on
the demo definitions and the console (no login, loopback only) on the same audit store, sends a
trickle of orders, and switches the payment service off for a while: the breaker sensor opens
the breaker (the ``breaker_closed`` check fails, the backlog sensor says it is throttled), then
probes and closes it once the service is back. The breaker's transitions and the alerts are
told as they happen (:mod:`kmq_dagster.demo.watch`). Runs until ``stop`` is set; then stops
everything it started.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.console.service import ConsoleService
from kmq_dagster.demo.dagster_service import DagsterService
from kmq_dagster.demo.orders import OUTAGE_FILE_VARIABLE
from kmq_dagster.demo.pipeline import DEMO_QUEUE, produce_orders
from kmq_dagster.demo.watch import alert_receiver, watching_breaker
from kmq_dagster.home import private_folder
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.settings import KmqSettings

WORKSPACE_YAML = """\
load_from:
  - python_module:
      module_name: kmq_dagster.definitions
      attribute: defs
"""


#: Where the demo's Dagster sends alerts; the demo receives them itself when it is not set.
WEBHOOK_VARIABLE = "KMQ_ALERT_WEBHOOK_URL"


class Timeline:
    """Seconds since the orders began: the prefix of every line about what happens."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self.started = time.monotonic()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def say(self, line: str) -> None:
        self._say(f"{self.elapsed_s():5.0f} s: {line}")


@contextmanager
def _alerts_told(timeline: Timeline) -> Iterator[dict[str, str]]:
    """The environment that sends the demo's alerts to a webhook of its own, which tells
    them; nothing when the user set :data:`WEBHOOK_VARIABLE` (their receiver gets them)."""
    if os.environ.get(WEBHOOK_VARIABLE):
        yield {}
        return
    with alert_receiver(timeline.say) as url:
        yield {WEBHOOK_VARIABLE: url}


@dataclass(frozen=True)
class OutageScript:
    """The payment service goes down ``after_s`` seconds in, and comes back ``for_s`` seconds
    after the breaker opened (or ``give_up_s`` into the outage if it never does). The end
    follows the breaker, not the clock: on a busy machine the first sensor-launched run may
    only start minutes in, and an outage over before any order failed would show nothing."""

    after_s: float = 20.0
    for_s: float = 20.0
    give_up_s: float = 600.0

    def is_down(self, elapsed_s: float, opened_s: float | None) -> bool:
        """Whether the service is down ``elapsed_s`` into the demo, the breaker having opened
        at ``opened_s`` (``None``: not yet)."""
        if elapsed_s < self.after_s:
            return False
        if opened_s is not None:
            return elapsed_s < max(opened_s, self.after_s) + self.for_s
        return elapsed_s < self.after_s + self.give_up_s


def run_demo_ui(
    workdir: Path,
    stop: threading.Event,
    say: Callable[[str], None],
    *,
    dagster_port: int | None = None,
    console_port: int | None = None,
    orders_per_s: float = 4.0,
    outage: OutageScript | None = OutageScript(),
) -> None:
    """Run the demo until ``stop`` is set, telling a person what happens through ``say``."""
    private_folder(workdir)  # it holds the audit store: others must not read it
    workspace = workdir / "workspace.yaml"
    workspace.write_text(WORKSPACE_YAML)
    outage_file = workdir / "payment-service-down"
    outage_file.unlink(missing_ok=True)
    with EmbeddedBroker(port=0) as broker:
        settings = KmqSettings(bootstrap_servers=broker.bootstrap_servers, session_timeout_ms=6_000)
        provision_queue(settings, DEMO_QUEUE)
        audit_url = f"sqlite:///{workdir / 'audit.db'}"
        env = {
            "KMQ_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "KMQ_SESSION_TIMEOUT_MS": "6000",
            "KMQ_AUDIT_URL": audit_url,
            "KMQ_DEMO_OUTPUT": str(workdir / "orders_priced.parquet"),
            OUTAGE_FILE_VARIABLE: str(outage_file),
        }
        say(f"embedded broker on {broker.bootstrap_servers}; starting Dagster ...")
        timeline = Timeline(say)
        with _alerts_told(timeline) as webhook:
            env.update(webhook)
            service = DagsterService(
                workspace, home=workdir / "dagster", port=dagster_port, env=env
            )
            console = ConsoleService(
                settings, audit_url, log_dir=workdir / "console", port=console_port
            )
            with (
                service as dagster,
                console,
                watching_breaker(audit_url, DEMO_QUEUE, timeline.say) as opened,
            ):
                _tell_where(dagster.url, audit_url, workdir, console.url, say)
                timeline.started = time.monotonic()
                _trickle(
                    settings, stop, orders_per_s=orders_per_s, outage=outage,
                    outage_file=outage_file, timeline=timeline, opened=opened,
                )  # fmt: skip


def _tell_where(
    dagster_url: str, audit_url: str, workdir: Path, console_url: str, say: Callable[[str], None]
) -> None:
    """Where to look, once everything is up."""
    say(f"Dagster UI:      {dagster_url}")
    say(f"  the queue:     {dagster_url}/assets/kmq/orders__pricing/queue")
    say(f"  its checks:    {dagster_url}/assets/kmq/orders__pricing/queue?view=checks")
    say(f"  runs:          {dagster_url}/runs")
    say(f"audit store:     {audit_url}")
    say(f"logs:            {workdir / 'dagster'}")
    say(f"console:         {console_url}  (no login: this machine only)")
    say("breaker transitions and alerts are told here as they happen")
    say("Ctrl-C stops everything")


def _trickle(
    settings: KmqSettings,
    stop: threading.Event,
    *,
    orders_per_s: float,
    outage: OutageScript | None,
    outage_file: Path,
    timeline: Timeline,
    opened: threading.Event,
) -> None:
    """Send orders in small bursts, and switch the outage on and off as scripted."""
    sent = 0
    down = False
    opened_s: float | None = None
    while not stop.is_set():
        elapsed = timeline.elapsed_s()
        due = int(elapsed * orders_per_s) - sent
        if due > 0:
            produce_orders(settings, due, first_id=sent)
            sent += due
        if outage is not None:
            if opened_s is None and opened.is_set():
                opened_s = elapsed
            should_be_down = outage.is_down(elapsed, opened_s)
            if should_be_down and not down:
                outage_file.touch()
                timeline.say("the payment service is down (orders fail): watch the breaker open")
            elif down and not should_be_down:
                outage_file.unlink(missing_ok=True)
                if opened_s is None:
                    timeline.say(
                        f"the payment service is back; the breaker did not open in "
                        f"{outage.give_up_s:.0f} s (is the Dagster daemon running its sensors?)"
                    )
                else:
                    timeline.say("the payment service is back: watch the breaker probe and close")
            down = should_be_down
        stop.wait(1.0)
    outage_file.unlink(missing_ok=True)
    timeline.say(f"stopping: {sent:,} orders sent")
