"""The command line under random input: every command, every option, strings, numbers (NaN,
infinity, huge, negative), durations and names, against a live embedded broker.

For each generated command line: the exit code is 0, 1 (an error) or 2 (a malformed command
line); stderr holds no traceback and, on error, one ``kmq: error:`` line; and a command that
failed produced nothing to the queue topic. Long-running commands get a stop request before
they start, so a valid command line sets everything up, then stops at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kmq_dagster.cli import main
from kmq_dagster.kafka.topic_reader import count_records
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue

pytestmark = pytest.mark.kafka

TOPIC = "fuzzed"
GROUP = "g"

numbers = st.sampled_from(
    ["0", "1", "-1", "3", "0.5", "nan", "NaN", "inf", "-inf", "1e308", "-1e308", "1e-320",
     "99999999999999999999", "2.5e3", "0x10", "", " ", "1,2", "½"]
)  # fmt: skip
durations = st.sampled_from(
    ["0s", "1ms", "500ms", "1s", "90s", "1h30m", "7d", "8d", "-5s", "5x", "99999999999999999999d",
     "1e3s", "", "s", "10", "nan", "1d1d", "2h ago"]
)  # fmt: skip
names = st.sampled_from(
    ["", ".", "..", " a", "a b", "x" * 300, "ünï", "a/b", "fuzzed", "g", "ca.b", "-", "_"]
) | st.text(max_size=12)
times = st.sampled_from(
    ["2h", "2h ago", "1000000d", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-05:00",
     "2026-11-23T10:00", "yesterday", "", "nan"]
)  # fmt: skip
anything = st.text(max_size=20) | numbers | durations
handlers = st.sampled_from(
    ["tests.support.flaky_handler:handle", "json:loads", "no.such:f", "x", ":", "json:",
     "json:nope", "tests.support.flaky_handler:", "os:getcwd"]
)  # fmt: skip

#: Per command: its fixed arguments, and the options fuzzed with a value each.
COMMANDS: dict[str, tuple[list[str], dict[str, st.SearchStrategy[str]]]] = {
    "provision": (["-t", TOPIC], {
        "--partitions": numbers, "--group": names, "--retry-delays": anything,
        "--retry-backoff": anything, "--max-attempts": numbers, "--retry-jitter": numbers,
        "--visibility-timeout": durations, "--max-redeliveries": numbers,
        "--replication-factor": numbers,
    }),
    "send": (["--value", "m"], {"--topic": names, "--key": anything, "--header": anything,
                                "--delay": durations}),
    "worker": (["-t", TOPIC, "-g", GROUP], {
        "--handler": handlers, "--batch-size": numbers, "--breaker-window": durations,
        "--breaker-error-rate": numbers, "--breaker-min-calls": numbers,
        "--breaker-cooldown": durations, "--breaker-probes": numbers, "--non-retryable": anything,
        "--audit-url": st.sampled_from(["garbage://x", "sqlite:///", "sqlite:////no/dir/a.db"]),
    }),
    "tracker": (["-t", TOPIC], {"--group": names}),
    "delayer": ([], {"--topic": names}),
    "replay": (["-t", TOPIC, "-g", GROUP, "--dry-run"], {
        "--offsets": anything, "--key": anything, "--error-type": anything, "--since": times,
        "--until": times, "--to": anything, "--rate": numbers, "--max-replays": numbers,
        "--replay-id": anything,
    }),
    "ingest": (["-t", TOPIC, "-g", GROUP, "--once"], {"--audit-url": anything}),
    "discard": (["-t", TOPIC, "-g", GROUP, "--dry-run"], {
        "--since": times, "--until": times, "--error-type": anything, "--key": anything,
    }),
    "broker": ([], {"--port": numbers, "--data-dir": st.sampled_from(["/proc/nope", ""])}),
}  # fmt: skip


@pytest.fixture(scope="module")
def fuzzed_queue(settings: KmqSettings) -> None:
    new_queue(settings, TOPIC, GROUP, partitions=1, delay_queue=True)


@pytest.fixture
def stop_at_once(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Long-running commands see a stop request before their first step."""

    def stopped() -> threading.Event:
        event = threading.Event()
        event.set()
        return event

    for module in ("queue_commands", "dead_letter_commands", "broker_commands"):
        monkeypatch.setattr(f"kmq_dagster.cli.{module}.stop_on_signals", stopped)
    yield


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-cwd")


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(COMMANDS)))
    fixed, options = COMMANDS[command]
    chosen = draw(st.lists(st.sampled_from(sorted(options)), min_size=1, max_size=3, unique=True))
    argv = [command, *fixed]
    for option in chosen:
        argv += [option, draw(options[option])]
    if command == "worker" and "--handler" not in chosen:
        argv += ["--handler", "json:loads"]
    return argv


@settings(
    max_examples=int(os.environ.get("KMQ_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argv=command_lines())
def test_every_command_line_ends_with_a_clean_exit_or_one_error_line(
    argv: list[str],
    settings: KmqSettings,
    fuzzed_queue: None,
    stop_at_once: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    scratch: Path,
) -> None:
    monkeypatch.setenv("KMQ_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("KMQ_SESSION_TIMEOUT_MS", "6000")
    monkeypatch.chdir(scratch)  # whatever a command writes to "." lands here
    sends = argv[0] == "send"  # the one command that produces to the queue topic
    before = count_records(settings, TOPIC, 1) if sends else 0

    code = main(argv)

    _out, err = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code:
        errors = [line for line in err.splitlines() if line.startswith("kmq: error: ")]
        assert len(errors) == 1, (argv, err)
        if sends:
            assert count_records(settings, TOPIC, 1) == before, f"{argv} failed but produced"
