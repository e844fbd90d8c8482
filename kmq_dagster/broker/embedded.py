"""The embedded broker: Tansu on loopback, in memory or durable on a local SeaweedFS.

Examples:
    >>> with EmbeddedBroker(port=0) as broker:          # doctest: +SKIP
    ...     producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO

from kmq_dagster.broker.binaries import tansu_binary
from kmq_dagster.broker.ports import (
    NO_VISIBLE_PROCESS,
    free_port,
    port_is_free,
    wait_until_free,
    who_listens,
)
from kmq_dagster.broker.probe import kafka_answers
from kmq_dagster.broker.process import ManagedProcess
from kmq_dagster.broker.seaweed import BUCKET, SeaweedS3
from kmq_dagster.core.lifecycle import Service
from kmq_dagster.errors import BrokerError

#: Cluster id Tansu is started with; fixed so a durable data dir restarts as the same cluster.
CLUSTER_ID = "kmq-embedded"
#: How long a start waits for a port that a process which just died still holds.
PORT_RELEASE_WAIT_S = 5.0
_LOCK_FILE = "kmq-broker.lock"


class EmbeddedBroker(Service):
    """Start and stop the embedded Kafka-compatible broker.

    Args:
        port: loopback port to serve Kafka on; ``0`` picks a free one.
        data_dir: where to keep topics, records and committed offsets across restarts;
            ``None`` keeps everything in memory (lost on stop).
        host: address to listen on and advertise; loopback by default.
    """

    def __init__(self, port: int = 0, data_dir: Path | str | None = None, host: str = "127.0.0.1"):
        self.host = host
        self.port = port
        self.data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self._tansu: ManagedProcess | None = None
        self._seaweed: SeaweedS3 | None = None
        self._lock: IO[str] | None = None
        self._scratch_dir: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def storage_description(self) -> str:
        if self.data_dir is None:
            return "in memory (lost when the broker stops)"
        return f"durable in {self.data_dir}"

    def start(self, timeout_s: float = 60.0) -> str:
        """Start the broker and wait until it answers Kafka requests.

        Returns:
            The bootstrap servers address, ``host:port``.

        Raises:
            BrokerError: the port is in use, a binary is missing, the data dir is unusable or
                the broker did not come up; nothing is left running.
        """
        try:
            return self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> str:
        pick_port = self.port == 0
        if not pick_port and not port_is_free(self.port, self.host) and not self._released_soon():
            holder = who_listens(self.port)
            raise BrokerError(
                f"port {self.port} on {self.host} is already in use "
                f"{f'by {holder} ' if holder else ''}"
                "(another broker running? pass --port 0 to pick a free port)"
            )
        env = dict(os.environ)
        if self.data_dir is None:
            self._scratch_dir = Path(tempfile.mkdtemp(prefix="kmq-broker-"))
            log_dir = self._scratch_dir
            storage = "memory://tansu/"
        else:
            log_dir = self._prepare_data_dir(self.data_dir)
            self._seaweed = SeaweedS3(
                self.data_dir / "s3",
                log_dir / "seaweedfs.log",
                self.host,
                avoid=() if pick_port else (self.port,),
            )
            self._seaweed.start(timeout_s)
            env.update(self._seaweed.tansu_env())
            storage = f"s3://{BUCKET}/"
        if pick_port:
            # Picked once SeaweedFS listens on every port of its own: picked before, the
            # broker's port was once one of SeaweedFS's gRPC ports (its HTTP ports + 10,000),
            # and Tansu found it taken.
            self.port = free_port(self.host)
        argv = [
            tansu_binary(),
            "broker",
            "--cluster-id",
            CLUSTER_ID,
            "--listener-url",
            f"tcp://{self.bootstrap_servers}",
            "--advertised-listener-url",
            f"tcp://{self.bootstrap_servers}",
            "--storage-engine",
            storage,
        ]
        self._tansu = ManagedProcess("Tansu", argv, log_dir / "tansu.log", env=env)
        self._tansu.start()
        self._wait_until_serving(self._tansu, timeout_s)
        return self.bootstrap_servers

    def _released_soon(self) -> bool:
        """A port no live process listens on is being released (a broker killed a moment ago:
        a supervisor restarting it at once): wait for that, up to ``PORT_RELEASE_WAIT_S``."""
        if who_listens(self.port) not in (None, NO_VISIBLE_PROCESS):
            return False
        return wait_until_free(self.port, self.host, PORT_RELEASE_WAIT_S)

    def _prepare_data_dir(self, data_dir: Path) -> Path:
        try:
            (data_dir / "s3").mkdir(parents=True, exist_ok=True)
            log_dir = data_dir / "logs"
            log_dir.mkdir(exist_ok=True)
            lock = (data_dir / _LOCK_FILE).open("a+")
        except OSError as exc:
            raise BrokerError(f"data dir {data_dir} is not usable: {exc.strerror}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise BrokerError(f"data dir {data_dir} is in use by another kmq broker") from None
        self._lock = lock
        return log_dir

    def _wait_until_serving(self, tansu: ManagedProcess, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not tansu.is_running():
                tail = tansu.log_tail()
                taken = ""
                if "AddrInUse" in tail and (holder := who_listens(self.port)):
                    # Free when checked, taken before Tansu bound it: say by whom.
                    taken = f"port {self.port} was taken meanwhile by {holder}\n"
                raise BrokerError(
                    f"the broker exited with code {tansu.exit_code()}:\n{taken}{tail}"
                )
            if kafka_answers(self.host, self.port):
                return
            time.sleep(0.05)
        raise BrokerError(f"the broker did not answer on {self.bootstrap_servers} in {timeout_s} s")

    def failed_child(self) -> str | None:
        """A description of a child that died while the broker should be running, else ``None``."""
        for child in (self._tansu, self._seaweed.process if self._seaweed else None):
            if child is not None and child.exit_code() is not None:
                return f"{child.name} exited with code {child.exit_code()}:\n{child.log_tail()}"
        return None

    def stop(self) -> None:
        """Stop the broker, then its storage; every child is reaped. Safe to call twice."""
        if self._tansu is not None:
            self._tansu.stop()
            self._tansu = None
        if self._seaweed is not None:
            self._seaweed.stop()
            self._seaweed = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if self._scratch_dir is not None:
            shutil.rmtree(self._scratch_dir, ignore_errors=True)
            self._scratch_dir = None
