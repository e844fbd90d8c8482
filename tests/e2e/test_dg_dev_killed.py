"""A killed ``dg dev`` leaves no tracker run behind. The tracker runs until terminated, and
Dagster's code server waits for the runs it launched before it shuts down, so a ``dg dev`` killed
with SIGKILL (no chance to stop anything) used to leave the tracker's run and step processes, and
the code server, running for good. The tracker now stops when a process it was started under is
gone (its lifeline). The real ``dg dev`` on the example project, a real broker."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.child_processes import descendants, is_running
from tests.e2e.dagster_graphql import DagsterClient
from tests.e2e.dg_project import DgDev, project_env
from tests.kafka_helpers import wait_for

QUEUE = "orders__invoicing"
PROVISION, TRACK = f"provision_{QUEUE}", f"track_{QUEUE}"


def run_processes(dev_pid: int, run_id: str, tracker_pid: int) -> set[int]:
    """The tracker's own process and every process of ``dg dev``'s tree running its run."""
    found = {tracker_pid}
    for pid in descendants(dev_pid):
        with contextlib.suppress(OSError):
            if run_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
    return found


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_dg_dev_leaves_no_tracker_run_running(tmp_path: Path) -> None:
    with EmbeddedBroker(port=0) as broker:
        env = project_env(
            {
                "KMQ_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                "KMQ_SESSION_TIMEOUT_MS": "6000",
                "KMQ_AUDIT_URL": f"sqlite:///{tmp_path / 'audit.db'}",
                "KMQ_ORDERS_OUTPUT": str(tmp_path / "orders_invoiced.parquet"),
            }
        )
        left: set[int] = set()
        try:
            with DgDev(home=tmp_path / "home", env=env) as dev:
                client = DagsterClient(dev)
                provision = client.launch(PROVISION)
                assert wait_for(lambda: client.status(PROVISION, provision) == "SUCCESS",
                                timeout_s=180, interval_s=1)  # fmt: skip

                def started_tracker() -> dict[str, str] | None:
                    started = [
                        {"run_id": run["runId"], "pid": run["tags"]["kmq/pid"]}
                        for run in client.runs(TRACK)
                        if run["status"] == "STARTED" and "kmq/heartbeat" in run["tags"]
                    ]
                    return started[0] if started else None

                # the keep-alive sensor starts it once the queue is provisioned
                assert wait_for(started_tracker, timeout_s=240, interval_s=1)
                tracker = started_tracker()
                assert tracker is not None
                dev_pid = dev.processes["dg-dev"].pid
                left = run_processes(dev_pid, tracker["run_id"], int(tracker["pid"]))
                assert len(left) >= 2, left  # the step process and the run worker

                os.kill(dev_pid, signal.SIGKILL)  # the leader only, as `kill -9` would

                # the tracker notices within a second, stops, and its run finishes: a bound
                # for a loaded machine, far below "never"
                assert wait_for(
                    lambda: not any(is_running(pid) for pid in left), timeout_s=120, interval_s=0.5
                ), (  # fmt: skip
                    f"still running: {sorted(p for p in left if is_running(p))}"
                )
        finally:
            for pid in left:  # whatever ends the test, nothing of the run stays
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
