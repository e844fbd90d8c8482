"""`kmq demo --ui` starts the broker, Dagster on the demo definitions and the console, prints
where to look, feeds orders, tells the scripted outage's breaker transitions and alerts as they
happen, and stops everything on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.kafka_helpers import wait_for
from tests.processes import descendants, kmq_argv, pid_alive

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_kmq_demo_ui_serves_dagster_and_the_console_and_stops_everything_on_ctrl_c(
    tmp_path: Path,
) -> None:
    log = tmp_path / "demo-ui.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            kmq_argv("demo", "--ui", "--dagster-port", "0", "--console-port", "0",
                    "--output-dir", str(tmp_path)),
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HOME": str(tmp_path)},
            start_new_session=True,
        )  # fmt: skip
    try:
        assert wait_for(lambda: "Ctrl-C stops everything" in log.read_text(), timeout_s=240), (
            log.read_text()[-3000:]
        )
        url = re.search(r"Dagster UI:\s+(\S+)", log.read_text())
        assert url is not None
        with urllib.request.urlopen(f"{url.group(1)}/server_info", timeout=30) as answer:
            assert answer.status == 200
        console = re.search(r"console:\s+(\S+)", log.read_text())
        assert console is not None
        with urllib.request.urlopen(f"{console.group(1)}/_stcore/health", timeout=30) as answer:
            assert answer.read().strip() == b"ok"
        children = descendants(process.pid)
        # the broker, the webserver, the daemon, the console (and code servers)
        assert len(children) >= 4
        assert wait_for(lambda: "orders__pricing" in urllib.request.urlopen(
            f"{url.group(1)}/graphql?query=%7BassetNodes%7BassetKey%7Bpath%7D%7D%7D", timeout=30
        ).read().decode(), timeout_s=60)  # fmt: skip

        # the scripted outage, told as it happens: the breaker opens, the alert goes out, it
        # probes and closes, and the resolve goes out
        def told(pattern: str) -> bool:
            return re.search(pattern, log.read_text(), re.MULTILINE) is not None

        opened = r"^\s*\d+ s: breaker opened: error rate \d+% over \d+ messages"
        assert wait_for(lambda: told(opened), timeout_s=420, interval_s=1), log.read_text()
        alert = r"^\s*\d+ s: alert sent: \[critical\] orders / pricing: circuit breaker open"
        assert wait_for(lambda: told(alert), timeout_s=60, interval_s=1), log.read_text()
        closed = r"^\s*\d+ s: breaker closed after (\d+m )?\d+s: "
        assert wait_for(lambda: told(closed), timeout_s=600, interval_s=1), log.read_text()
        resolved = r"alert sent: \[info\] orders / pricing: resolved: circuit breaker closed"
        assert wait_for(lambda: told(resolved), timeout_s=60, interval_s=1), log.read_text()

        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=90) == 130, log.read_text()[-3000:]  # Ctrl-C
        assert time.monotonic() - started < 60
        assert "stopping:" in log.read_text()
        assert wait_for(lambda: not [pid for pid in children if pid_alive(pid)], timeout_s=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
