"""A stop signal never hangs the process it asks to stop (``kmq_dagster.cli.signal_safe``).

Each case runs in a Python process of its own, since it signals itself; a process that hangs
is killed at the limit and the test fails. The signals come while the main thread holds the
lock ``Event.set`` takes, as it does inside ``Event.wait`` (on entry and on waking) and inside a
first handler's ``set`` when a second Ctrl-C follows at once: where the old handlers, which
set the event themselves, waited for good (a worker hung in CI until SIGKILL, stop 60).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

LIMIT_S = 60


def run_script(body: str) -> list[str]:
    """Run ``body`` in a fresh Python process; the lines it printed (it must end in time)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_two_ctrl_c_while_the_stop_event_is_locked_stop_the_command_with_130() -> None:
    # given a long-lived command's stop event, whose lock the main thread holds
    # when Ctrl-C comes twice and both handlers run inside that hold
    printed = run_script(
        """
        import os, signal, time
        from kmq_dagster.cli import options

        stop = options.stop_on_signals()
        with stop._cond:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            limit = time.monotonic() + 30
            while len(options._stop_signals) < 2 and time.monotonic() < limit:
                pass  # the handlers run here, between bytecodes, with the lock held
        print(len(options._stop_signals), stop.wait(30), options.stop_exit_code())
        """
    )

    # then both handlers returned, the event is set, and the exit code is Ctrl-C's
    assert printed == ["2", "True", "130"]


def test_a_dlq_action_signalled_while_its_stop_is_locked_stops_then_is_interrupted() -> None:
    # given a replay's stop request (DLQ actions), whose lock the main thread holds
    # when SIGTERM comes, and then Ctrl-C once the lock is released
    printed = run_script(
        """
        import os, signal, time
        from kmq_dagster.cli.dead_letter_commands import Signalled, stopping_on_signals

        with stopping_on_signals() as stop:
            with stop._cond:
                os.kill(os.getpid(), signal.SIGTERM)
                limit = time.monotonic() + 30
                while stop.reason == "cancelled" and time.monotonic() < limit:
                    pass  # the handler runs here, with the lock held
            print(stop.wait(30), stop.reason)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                limit = time.monotonic() + 30
                while time.monotonic() < limit:
                    pass
            except Signalled as interrupted:
                print("interrupted", interrupted)
        """
    )

    # then the first signal set the request with its reason, and the second one interrupted
    assert printed == ["True", "SIGTERM", "interrupted", "SIGTERM"]
