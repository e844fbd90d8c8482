"""A real ``kmq console`` process for the browser tests: started on a free port, served until
the block ends, then stopped."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kmq_dagster.broker.ports import free_port
from kmq_dagster.child_processes import is_running
from tests.kafka_helpers import wait_for
from tests.processes import kmq_argv, stop


@contextmanager
def running_console(home: Path, env: Mapping[str, str], audit_url: str) -> Iterator[str]:
    """Run ``kmq console`` on the store ``audit_url`` with ``env``, its log in
    ``home/console.log``; yields its URL once it answers its health check."""
    port = free_port()
    log = (home / "console.log").open("w")
    argv = kmq_argv("console", "--port", str(port), "--audit-url", audit_url)
    process = subprocess.Popen(argv, env=dict(env), cwd=home,
                               stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: healthy(url), timeout_s=60), (home / "console.log").read_text()
        yield url
    finally:
        try:
            stop(process)
        finally:
            log.close()
        assert not is_running(process.pid)


def healthy(url: str) -> bool:
    """Whether the Streamlit server at ``url`` says it is healthy."""
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
            return bool(response.read().strip() == b"ok")
    except OSError:
        return False
