"""A child process in its own session, stopped with SIGTERM then SIGKILL, always reaped.

The child also dies with its parent: on Linux it asks the kernel (``prctl(PR_SET_PDEATHSIG)``)
for SIGKILL when the process that started it ends, however that ends. Without it, a SIGKILL of
``kmq broker`` left Tansu and SeaweedFS running as orphans that held the port.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from kmq_dagster.errors import BrokerError

#: ``prctl`` option: the signal the calling process gets when its parent dies.
_PR_SET_PDEATHSIG = 1
#: The C library, loaded before any fork: a forked child must not search for it.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_parent(parent_pid: int) -> None:
    """In a forked child before ``exec``: be SIGKILLed when the parent ends, however it ends.

    The kernel keeps the setting across ``exec``; it fires when the *thread* that started the
    child ends, so start children from a thread that lives as long as they should (the main
    thread, as ``kmq broker`` does). A child whose parent ``parent_pid`` is already gone ends
    at once. Does nothing outside Linux.
    """
    if _LIBC is None:
        return
    if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() != parent_pid:
        os._exit(1)


class ManagedProcess:
    """Runs ``argv`` with output appended to ``log_path``; :meth:`stop` ends its whole group."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        stop_timeout_s: float = 15.0,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.stop_timeout_s = stop_timeout_s
        self.stop_signal = stop_signal
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def start(self) -> None:
        """Start the process in a new session (its own process group).

        Raises:
            BrokerError: the executable could not be run.
        """
        with self.log_path.open("ab") as log:
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    # Safe with threads: the child only calls prctl and getppid before exec.
                    preexec_fn=functools.partial(die_with_parent, os.getpid()),  # noqa: PLW1509
                )
            except OSError as exc:
                raise BrokerError(f"cannot run {self.name} ({self.argv[0]}): {exc}") from exc

    def exit_code(self) -> int | None:
        """The exit code once the process has ended, else ``None``."""
        return None if self._popen is None else self._popen.poll()

    def is_running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def stop(self) -> None:
        """Send ``stop_signal`` (SIGTERM) to the process group, SIGKILL it after
        ``stop_timeout_s``; reap the child."""
        popen = self._popen
        if popen is None:
            return
        if popen.poll() is None:
            self._signal_group(popen.pid, self.stop_signal)
            try:
                popen.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(popen.pid, signal.SIGKILL)
                popen.wait()
        # Helpers the process forked into its group must not outlive it.
        self._signal_group(popen.pid, signal.SIGKILL)
        self._popen = None

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of the log, for error messages."""
        try:
            with self.log_path.open("r", errors="replace") as log:
                return "".join(deque(log, maxlen=lines)).rstrip()
        except OSError:
            return ""

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
