"""No broker: `kmq status`, `kmq send` and `kmq provision --plan` say so in seconds when the
connection is refused, and a broker that accepts but does not answer still gets the whole request
timeout."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from kmq_dagster.broker.ports import free_port
from kmq_dagster.cli import main
from kmq_dagster.errors import KafkaUnavailableError
from kmq_dagster.kafka.clients import cluster_metadata
from kmq_dagster.settings import KmqSettings
from tests.processes import kmq_argv

#: A request timeout far above the bound below: waiting for it would fail the test.
REQUEST_TIMEOUT_MS = 30_000
#: What a refused connection may take in process (the refusal is known after 2 s).
FAIL_FAST_S = 8.0

COMMANDS = {
    "status": ["status"],
    "send": ["send", "-t", "orders", "--value", "x"],
    "provision --plan": ["provision", "-t", "orders", "-p", "2", "-g", "g", "--plan"],
}


@pytest.fixture
def nothing_listening(monkeypatch: pytest.MonkeyPatch) -> str:
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("KMQ_BOOTSTRAP_SERVERS", address)
    monkeypatch.setenv("KMQ_REQUEST_TIMEOUT_MS", str(REQUEST_TIMEOUT_MS))
    return address


@pytest.mark.parametrize("command", COMMANDS)
def test_a_refused_connection_is_reported_in_seconds(
    command: str, nothing_listening: str, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code = main(COMMANDS[command])
    elapsed_s = time.monotonic() - started

    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"kmq: error: cannot reach Kafka at {nothing_listening}: the connection")
    assert "refused" in err and err.count("\n") == 1, err
    assert elapsed_s < FAIL_FAST_S, f"{command} took {elapsed_s:.1f} s"


def test_both_commands_print_one_line_as_processes(nothing_listening: str) -> None:
    started = time.monotonic()
    # Both at once: on a loaded machine the interpreter's start alone takes seconds.
    runs = {
        name: subprocess.Popen(
            kmq_argv(*argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, argv in COMMANDS.items()
    }
    try:
        results = {name: run.communicate(timeout=120) for name, run in runs.items()}
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait(10)
    elapsed_s = time.monotonic() - started

    for name, (_out, err) in results.items():
        assert runs[name].returncode == 1, err
        assert err.startswith(f"kmq: error: cannot reach Kafka at {nothing_listening}"), err
        assert err.count("\n") == 1 and "Traceback" not in err, err
    # Well under the request timeout the commands would have waited before.
    assert elapsed_s < REQUEST_TIMEOUT_MS / 1000, elapsed_s


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port that accepts TCP connections (the kernel's backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"127.0.0.1:{server.getsockname()[1]}"


def test_a_broker_that_accepts_but_is_slow_gets_the_whole_timeout(silent_listener: str) -> None:
    settings = KmqSettings(bootstrap_servers=silent_listener, request_timeout_ms=5_000)

    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match="within 5 s"):
        cluster_metadata(settings)

    assert time.monotonic() - started >= 4.9


@pytest.mark.usefixtures("bootstrap_env")
@pytest.mark.kafka
def test_with_a_broker_both_commands_work(settings: KmqSettings, topic_name: str) -> None:
    assert main(["provision", "-t", topic_name, "-g", "g", "-p", "1"]) == 0
    assert main(["send", "-t", topic_name, "--value", "x"]) == 0
    assert main(["status", "-t", topic_name]) == 0
