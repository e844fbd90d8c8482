"""The CPU accounting of ``kmq bench spark`` counts the processes this one started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kmq_dagster.bench import cpu
from tests.kafka_helpers import wait_for

pytestmark = pytest.mark.skipif(not cpu.available(), reason="reads /proc (Linux)")

#: A child that spins until it has used this much CPU itself.
BURN_S = 0.3


def test_a_child_that_ran_and_ended_counts() -> None:
    before = cpu.tree_cpu_s()
    burn = f"import time\nwhile time.process_time() < {BURN_S}: pass"
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=30)

    # Its time is now in this process's reaped-children time (clock ticks: allow rounding).
    assert cpu.used_since(before)["python"] >= 0.8 * BURN_S


def test_an_unrelated_process_does_not_count() -> None:
    # Started by a child that exits at once: the spinner is re-parented away from this tree.
    spinner = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
            f"'import time\\nwhile time.process_time() < {BURN_S}: pass']); print(p.pid)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(spinner.stdout)
    before = cpu.tree_cpu_s()
    assert wait_for(lambda: not _alive(orphan), timeout_s=30, interval_s=0.02)

    assert cpu.used_since(before)["python"] < BURN_S / 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
