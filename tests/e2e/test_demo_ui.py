"""`kmq demo --ui` starts the broker, Dagster on the demo definitions and the console, prints
where to look, feeds orders, tells the scripted outage's breaker opening and its alert as they
happen, and stops everything on Ctrl-C in the middle of the outage, processing runs in flight.
Its folder is private: it draws no warning of ours.

How the outage ends (the breaker probes and closes, the resolve alert) is shown elsewhere: the
closing against a real Dagster daemon in ``tests/e2e/test_dagster_daemon.py``, its narration in
``tests/integration/test_demo_watch.py``, the outage's script in ``tests/unit/test_demo_outage.py``
(waiting for it here cost the suite one to two more minutes of a loaded machine)."""

from __future__ import annotations

import re
import signal
import stat
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.process_tree import running_kmq
from tests.kafka_helpers import WaitBudget, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Every wait of the test together, on a loaded 2-core machine: Dagster's start (up to 4 min
#: there), the scripted outage (the breaker opens 33-60 s in on a quiet machine, several
#: minutes later on a loaded one: each sensor-launched run starts its own Spark session), Ctrl-C
#: and the children's exit.
WAIT_S = 900
#: pytest's limit for the test: its waits, the HTTP requests (30 s each at most) and killing
#: whatever is left.
TIMEOUT_S = WAIT_S + 180


@pytest.mark.timeout(TIMEOUT_S)
def test_kmq_demo_ui_serves_dagster_and_the_console_and_stops_everything_on_ctrl_c(
    tmp_path: Path,
) -> None:
    budget = WaitBudget(WAIT_S, limit_s=WAIT_S)
    home, clone = tmp_path / "home", tmp_path / "clone"
    clone.mkdir()
    with running_kmq("demo", "--ui", "--dagster-port", "0", "--console-port", "0",
                     log=tmp_path / "demo-ui.log", cwd=clone, env={"HOME": str(home)},
                     ) as demo:  # fmt: skip

        def told(pattern: str) -> bool:
            return re.search(pattern, demo.text(), re.MULTILINE) is not None

        def wait_until_told(pattern: str, limit_s: float) -> None:
            assert wait_for(lambda: told(pattern) or demo.process.poll() is not None,
                            timeout_s=min(limit_s, budget.left_s()), interval_s=1,
                            ), demo.text()[-3000:]  # fmt: skip
            assert told(pattern), demo.text()[-3000:]

        wait_until_told("Ctrl-C stops everything", 300)
        url = re.search(r"Dagster UI:\s+(\S+)", demo.text())
        assert url is not None
        with urllib.request.urlopen(f"{url.group(1)}/server_info", timeout=30) as answer:
            assert answer.status == 200
        console = re.search(r"console:\s+(\S+)", demo.text())
        assert console is not None
        with urllib.request.urlopen(f"{console.group(1)}/_stcore/health", timeout=30) as answer:
            assert answer.read().strip() == b"ok"
        # the broker, the webserver, the daemon, the console (and code servers)
        assert len(demo.still_running()) >= 4, demo.still_running()
        assert wait_for(lambda: "orders__pricing" in urllib.request.urlopen(
            f"{url.group(1)}/graphql?query=%7BassetNodes%7BassetKey%7Bpath%7D%7D%7D", timeout=30
        ).read().decode(), timeout_s=min(60, budget.left_s()))  # fmt: skip

        # the scripted outage, told as it happens: the breaker opens, the alert goes out
        wait_until_told(r"^\s*\d+ s: breaker opened: error rate \d+% over \d+ messages", 600)
        wait_until_told(
            r"^\s*\d+ s: alert sent: \[critical\] orders / pricing: circuit breaker open", 60
        )

        started = time.monotonic()
        demo.process.send_signal(signal.SIGINT)  # Ctrl-C
        assert demo.process.wait(timeout=min(90, budget.left_s())) == 130, demo.text()[-3000:]
        assert time.monotonic() - started < 60
        assert "stopping:" in demo.text()
        assert wait_for(lambda: not demo.still_running(), timeout_s=min(30, budget.left_s())), (
            demo.still_running()
        )

    # its folder is ~/.kmq/demo/ui, private, and nothing of ours warned about it
    workdir = home / ".kmq" / "demo" / "ui"
    assert (workdir / "audit.db").exists()
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
    assert stat.S_IMODE(workdir.parent.stat().st_mode) == 0o700
    assert "readable by other users" not in demo.text(), demo.text()[-3000:]
    assert list(clone.iterdir()) == []
