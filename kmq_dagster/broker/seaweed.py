"""SeaweedFS (``weed mini``) serving S3 on loopback: the disk behind a durable broker."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from kmq_dagster.broker.binaries import weed_binary
from kmq_dagster.broker.ports import free_port
from kmq_dagster.broker.process import ManagedProcess
from kmq_dagster.errors import BrokerError

#: The bucket Tansu stores topics, records and offsets in.
BUCKET = "tansu"
#: Fixed credentials: the S3 endpoint listens on 127.0.0.1 only and is private to the broker.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "kmq-local", "AWS_SECRET_ACCESS_KEY": "kmq-local-secret"}
#: SeaweedFS serves gRPC on each HTTP port + this offset.
GRPC_PORT_OFFSET = 10_000
_COMPONENTS = ("s3", "master", "volume", "filer", "admin")


class SeaweedS3:
    """One ``weed mini`` process storing its data under ``data_dir``."""

    def __init__(
        self, data_dir: Path, log_path: Path, host: str = "127.0.0.1", avoid: Iterable[int] = ()
    ) -> None:
        self.host = host
        self.data_dir = data_dir
        self.ports = _component_ports(host, set(avoid))
        argv = [
            weed_binary(),
            "mini",
            f"-dir={data_dir}",
            f"-ip={host}",
            f"-ip.bind={host}",
            "-admin.ui=false",
            "-webdav=false",
            f"-bucket={BUCKET}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *(f"-{name}.port={port}" for name, port in self.ports.items()),
        ]
        self.process = ManagedProcess("SeaweedFS", argv, log_path, env=_env_with_credentials())

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3']}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start and wait until the bucket exists.

        Raises:
            BrokerError: the process died or the bucket did not appear in time.
        """
        self.process.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.process.is_running():
                raise BrokerError(
                    f"SeaweedFS exited with code {self.process.exit_code()}:\n"
                    f"{self.process.log_tail()}"
                )
            if self._bucket_exists():
                return
            time.sleep(0.2)
        self.process.stop()
        raise BrokerError(f"SeaweedFS did not serve S3 within {timeout_s:.0f} s")

    def stop(self) -> None:
        self.process.stop()

    def tansu_env(self) -> dict[str, str]:
        """Environment that points Tansu's S3 storage engine here."""
        return {
            **S3_CREDENTIALS,
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def _bucket_exists(self) -> bool:
        # The filer lists a bucket as the folder /buckets/<name>/ once it has been created.
        url = f"http://{self.host}:{self.ports['filer']}/buckets/{BUCKET}/"
        request = urllib.request.Request(url, method="GET", headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=1.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False


def _component_ports(host: str, avoid: set[int]) -> dict[str, int]:
    """A free HTTP port per component, its gRPC port (+ ``GRPC_PORT_OFFSET``) free too, and
    none of them in ``avoid`` nor among each other's: nothing listens on any of them until
    ``weed mini`` starts, so a free-port check alone let two of them take one port."""
    ports: dict[str, int] = {}
    for name in _COMPONENTS:
        port = free_port(host, GRPC_PORT_OFFSET, avoid)
        ports[name] = port
        avoid |= {port, port + GRPC_PORT_OFFSET}
    return ports


def _env_with_credentials() -> dict[str, str]:
    return {**os.environ, **S3_CREDENTIALS}
