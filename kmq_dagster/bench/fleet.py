"""Real ``kmq`` processes for fault scenarios: started, SIGKILLed, paused, restarted by PID.

Every process runs in its own process group and dies with the process that started it
(:func:`~kmq_dagster.broker.process.die_with_parent`), so a benchmark or test that ends early
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from kmq_dagster.broker.process import die_with_parent
from kmq_dagster.child_processes import descendants, is_running
from kmq_dagster.errors import BrokerError

_BOOTSTRAP_LINE = re.compile(r"export KMQ_BOOTSTRAP_SERVERS=(\S+)")
#: How long a process gets to stop after SIGTERM before it is SIGKILLed.
STOP_TIMEOUT_S = 30.0


def kmq_argv(*args: str) -> list[str]:
    """argv running the ``kmq`` command with this interpreter."""
    return [sys.executable, "-m", "kmq_dagster.cli", *args]


class KmqProcess:
    """One ``kmq`` command running as a child process, its output in ``log_path``."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: Mapping[str, str]):
        self.name = name
        self.args = args
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                kmq_argv(*args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
                # Safe with threads: the child only calls prctl and getppid before exec.
                preexec_fn=functools.partial(die_with_parent, os.getpid()),  # noqa: PLW1509
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and its group; reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`; returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # helpers it forked
        return self.popen.wait()

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


class Fleet:
    """The processes of one scenario; :meth:`stop_all` ends every one of them by PID."""

    def __init__(self, log_dir: Path, env: Mapping[str, str]) -> None:
        self.log_dir = log_dir
        self.env = {**os.environ, **env}
        self.processes: list[KmqProcess] = []

    def start(self, name: str, *args: str) -> KmqProcess:
        log_path = self.log_dir / f"{name}-{len(self.processes)}.log"
        process = KmqProcess(name, list(args), log_path, self.env)
        self.processes.append(process)
        return process

    def restart(self, process: KmqProcess) -> KmqProcess:
        """A new process running what ``process`` ran (which must have ended)."""
        return self.start(process.name, *process.args)

    def stop_all(self) -> None:
        """Stop every process: the clients first (so they can write what they hold), then
        the broker."""
        clients = [p for p in self.processes if p.name != "broker"]
        brokers = [p for p in self.processes if p.name == "broker"]
        for group in (clients, brokers):
            for process in group:
                if process.alive():
                    process.popen.send_signal(signal.SIGTERM)
            for process in group:
                process.stop()

    def dead(self, processes: list[KmqProcess]) -> list[str]:
        """Descriptions of those of ``processes`` that exited, with their last log lines."""
        return [
            f"{p.name} (pid {p.pid}) exited with {p.popen.returncode}:\n{p.log_tail()}"
            for p in processes
            if not p.alive()
        ]


class BrokerRun:
    """``kmq broker`` on a fixed port (so it can come back on it), as a child process."""

    def __init__(self, fleet: Fleet, port: int, data_dir: Path | None) -> None:
        self.fleet = fleet
        self.port = port
        self.data_dir = data_dir
        self.process: KmqProcess | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90) -> None:
        """Start it and wait until it prints its address.

        Raises:
            BrokerError: it exited or did not serve in time.
        """
        args = ["broker", "--port", str(self.port)]
        if self.data_dir is not None:
            args += ["--data-dir", str(self.data_dir)]
        self.process = process = self.fleet.start("broker", *args)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _BOOTSTRAP_LINE.search(process.log_path.read_text(errors="replace")):
                return
            if not process.alive():
                break
            time.sleep(0.1)
        process.kill()
        raise BrokerError(f"kmq broker did not start:\n{process.log_tail()}")

    def sigkill(self, children_timeout_s: float = 30.0) -> None:
        """SIGKILL the ``kmq broker`` process alone: its descendants (children and theirs)
        must die with it. Returns once they have (the kernel kills them after their parent,
        not with it: a restart on the same port found Tansu still listening there on a loaded
        machine).

        Raises:
            BrokerError: a descendant was still alive ``children_timeout_s`` after its parent.
        """
        assert self.process is not None
        children = descendants(self.process.pid)
        self.process.popen.send_signal(signal.SIGKILL)
        self.process.popen.wait()
        deadline = time.monotonic() + children_timeout_s
        while alive := [pid for pid in children if is_running(pid)]:
            if time.monotonic() > deadline:
                raise BrokerError(f"children {alive} of kmq broker outlived it")
            time.sleep(0.02)

    def serving_pid(self) -> int:
        """PID of the process that serves Kafka (Tansu, a child of ``kmq broker``)."""
        assert self.process is not None
        for pid in descendants(self.process.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f":{self.port}".encode() in cmdline:
                return pid
        raise BrokerError(f"no process of kmq broker (pid {self.process.pid}) serves {self.port}")
