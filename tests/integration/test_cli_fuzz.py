"""The command line under random input: every command, every option, strings, numbers (NaN,
infinity, huge, negative), durations and names, against a live embedded broker.

For each generated command line: the exit code is 0, 1 (an error) or 2 (a malformed command
line); stderr holds no traceback and, on error, one ``kmq: error:`` line; a password planted in
malformed connection options is never printed; and a command that failed produced nothing to
the queue topic. Long-running commands get a stop request before they start, so a valid
command line sets everything up, then stops at once. Below the fuzzing, each hostile case
issue 26 found has a test of its own.
"""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kmq_dagster.cli import main
from kmq_dagster.core.headers import replace_headers
from kmq_dagster.core.retry_headers import Failure, Origin, copy_headers
from kmq_dagster.kafka.clients import admin_client, cluster_metadata
from kmq_dagster.kafka.topic_reader import count_records
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import group_of, new_queue, produce, read_topic, wait_for
from tests.processes import kmq_argv, stop
from tests.support.kmq_cli import KmqCli

pytestmark = pytest.mark.kafka

TOPIC = "fuzzed"
GROUP = group_of(TOPIC)

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
#: Bytes an argument cannot carry as text (kept as lone surrogates) and terminal escapes.
hostile = st.sampled_from(["\udcff", "a\udcfeb", "\x1b]52;c;eA==\x07", "\x1b[2J", "1s,,2s"])
anything = st.text(max_size=20) | numbers | durations | hostile
#: A password planted in connection options written every wrong way; it must never be printed.
FUZZ_SECRET = "Fuzz-Secret-26"
connection_mistakes: st.SearchStrategy[list[str]] = st.just([]) | st.sampled_from(
    [["-X", f"sasl.password:{FUZZ_SECRET}"], ["-X", f"={FUZZ_SECRET}"],
     ["-X", "sasl.password", FUZZ_SECRET], ["-b", f"kmq:{FUZZ_SECRET}@127.0.0.1:1"], ["-b", ""],
     ["-X", f"sasl.password={FUZZ_SECRET}", "-X", "security.protocol=bogus"]]
)  # fmt: skip
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
        "--replay-id": anything, "--to-topic": anything, "--dlq-topic": anything,
        "--format": anything,
    }),
    "ingest": (["-t", TOPIC, "-g", GROUP, "--once"], {
        "--audit-url": anything, "--dlq-topic": anything, "--format": anything,
    }),
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
    return argv + draw(connection_mistakes)


@pytest.mark.usefixtures("bootstrap_env")
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
    monkeypatch.setenv("KMQ_SESSION_TIMEOUT_MS", "6000")
    monkeypatch.chdir(scratch)  # whatever a command writes to "." lands here
    sends = argv[0] == "send"  # the one command that produces to the queue topic
    before = count_records(settings, TOPIC, 1) if sends else 0

    code = main(argv)

    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    assert FUZZ_SECRET not in out + err, (argv, err)
    if code:
        errors = [line for line in err.splitlines() if line.startswith("kmq: error: ")]
        assert len(errors) == 1, (argv, err)
        if sends:
            assert count_records(settings, TOPIC, 1) == before, f"{argv} failed but produced"


# -- the hostile cases of issue 26, each one on its own --------------------------------------

PLANTED = "Planted-Pw-26"


def run_real(
    args: list[str | bytes], settings: KmqSettings, **kwargs: Any
) -> subprocess.CompletedProcess[bytes]:
    """A real ``kmq`` process (argv as bytes where a test needs bytes that are not UTF-8)."""
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "KMQ_SESSION_TIMEOUT_MS": "6000"}  # fmt: skip
    return subprocess.run(
        [*kmq_argv(), *args], env=env, capture_output=True, timeout=180, check=False, **kwargs
    )


def one_error_line(result: subprocess.CompletedProcess[bytes]) -> str:
    err = result.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("kmq: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("option", "argument", "names"),
    [
        (b"--value", b"\xff", "--value: the argument is not UTF-8 text (byte 0xff); send "
         "arbitrary bytes with --value-file PATH"),
        (b"--key", b"k\xfe", "--key: the argument is not UTF-8 text (byte 0xfe); send "
         "arbitrary bytes with --key-file PATH"),
        (b"--header", b"h=\xff", "--header: the argument is not UTF-8 text (byte 0xff); send "
         "arbitrary header bytes with --header-file NAME=PATH"),
        (b"--header", b"\xff=v", "--header: the argument is not UTF-8 text"),  # was a SIGSEGV
    ],
)  # fmt: skip
def test_send_refuses_arguments_that_are_not_utf8_naming_the_option_and_sends_nothing(
    settings: KmqSettings, fuzzed_queue: None, option: bytes, argument: bytes, names: str
) -> None:
    before = count_records(settings, TOPIC, 1)
    extra = [] if option == b"--value" else [b"--value", b"m"]

    result = run_real([b"send", b"-t", TOPIC.encode(), *extra, option, argument], settings)

    assert result.returncode == 1
    assert one_error_line(result).startswith(f"kmq: error: {names}")
    assert count_records(settings, TOPIC, 1) == before


def test_files_send_arbitrary_bytes_exactly(settings: KmqSettings, tmp_path: Path) -> None:
    topic = f"bytes-{uuid.uuid4().hex[:8]}"
    new_queue(settings, topic)
    value, key, header = b"\xff\x00\x1b[2J\n\xfe", b"k\xff", b"\x80h"
    for name, data in (("v.bin", value), ("k.bin", key), ("h.bin", header)):
        (tmp_path / name).write_bytes(data)

    result = run_real(
        ["send", "-t", topic, "--value-file", str(tmp_path / "v.bin"), "--key-file",
         str(tmp_path / "k.bin"), "--header-file", f"raw={tmp_path / 'h.bin'}"], settings
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    [record] = read_topic(settings, topic, 1, at_least=1)
    assert (record.value(), record.key(), record.headers()) == (value, key, [("raw", header)])


def test_a_message_over_the_size_limit_is_one_error_line_and_nothing_is_sent(
    settings: KmqSettings, fuzzed_queue: None
) -> None:
    before = count_records(settings, TOPIC, 1)
    lines = b"small\n" + b"x" * 20_000_000 + b"\n"

    result = run_real(["send", "-t", TOPIC], settings, input=lines)

    assert result.returncode == 1
    line = one_error_line(result)
    assert "stdin line 2: 20,000,000 bytes" in line and "limit of 16,777,216 bytes" in line
    assert "-X message.max.bytes=N" in line
    assert count_records(settings, TOPIC, 1) == before  # not even the small first line


@pytest.mark.parametrize(
    "args",
    [
        ["provision", "-t", TOPIC, "-X", f"sasl.password:{PLANTED}"],
        ["provision", "-t", TOPIC, "-X", f"={PLANTED}"],
        ["provision", "-t", TOPIC, "-b", f"kmq:{PLANTED}@127.0.0.1:1"],
        ["provision", "-t", TOPIC, "-X", "sasl.password", PLANTED],  # click's usage error
        ["-X", "sasl.password", PLANTED, "provision", "-t", TOPIC],
        ["provision", "-t", TOPIC, "-X", f"sasl.password={PLANTED}", "--partitions", PLANTED],
        ["provision", "-t", TOPIC, "-X", PLANTED],
    ],
)
def test_a_password_in_a_malformed_option_is_never_printed(
    settings: KmqSettings, args: list[str]
) -> None:
    result = run_real([*args], settings)

    assert result.returncode in (1, 2)
    one_error_line(result)
    assert PLANTED.encode() not in result.stdout + result.stderr, result.stderr


@pytest.mark.usefixtures("bootstrap_env")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["provision", "-t", "{t}", "-g", "g", "--retry-delays", "1s,,2s"], "--retry-delays:"),
        (["provision", "-t", "{t}", "-p", "1", "--delays", "--delay-levels", "9d"],
         "--delay-levels: delay levels are"),
        (["provision", "-t", "{t}", "-b", ""], "--bootstrap-servers: bootstrap servers must not "
         "be empty"),
        (["provision", "-t", "{t}", "-b", "127.0.0.1:1,,x:2"], "--bootstrap-servers: "
         "bootstrap servers have an empty entry"),
        (["provision", "-t", "{t}", "--partitions", "100000"], "--partitions: 100000 is not in "
         "[1, 1000]"),
        (["worker", "-t", "{t}", "-g", "g", "--handler", "json:loads", "--max-buffered",
          "1000000000"], "--max-buffered:"),
        (["worker", "-t", "{t}", "-g", "g", "--handler", "json:loads", "--drain-timeout",
          "inf"], "--drain-timeout:"),
    ],
)  # fmt: skip
def test_values_accepted_before_are_one_error_line_and_create_nothing(
    settings: KmqSettings,
    topic_name: str,
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:

    code = main([arg.format(t=topic_name) for arg in args])

    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"kmq: error: {message}"), err
    assert not any(name.startswith(topic_name) for name in _topics(settings))


def test_a_handler_module_exiting_at_import_is_one_error_line(
    settings: KmqSettings, fuzzed_queue: None, tmp_path: Path
) -> None:
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n")

    result = run_real(
        ["worker", "-t", TOPIC, "-g", GROUP, "--handler", "exits_at_import:handle"],
        settings, cwd=tmp_path,
    )  # fmt: skip

    assert result.returncode == 1
    assert one_error_line(result) == (
        "kmq: error: --handler: importing handler module 'exits_at_import' called exit(3)"
    )


def test_dead_letters_cannot_drive_the_operators_terminal(
    settings: KmqSettings, topic_name: str, kmq_cli: KmqCli
) -> None:
    queue = new_queue(settings, topic_name, GROUP).queue
    clipboard, clear = "\x1b]52;c;cm0gLXJmIH4=\x07", "\x1b[2J"
    headers = copy_headers(
        Origin(topic_name, 0, 7, 1_700_000_000_000), GROUP,
        Failure(f"Timeout{clear}Error", f"boom{clipboard}"), attempt=2,
        dlq_reason=f"failed\r{clear}\x9b2J\x08",
    )  # fmt: skip
    producer = Producer(settings.producer_config())
    producer.produce(
        queue.dlq_topic, key=f"k{clear}".encode(), value=f"v{clipboard}{clear}\x85".encode(),
        headers=[*replace_headers([(f"h{clear}", clipboard.encode())], headers)],
    )  # fmt: skip
    assert producer.flush(30) == 0

    listed = kmq_cli.ok("dlq", "list", "-t", topic_name, "-g", GROUP)
    shown = kmq_cli.ok("dlq", "show", "-t", topic_name, "-g", GROUP, "0:0")
    replayed = kmq_cli.ok("replay", "-t", topic_name, "-g", GROUP, "--dry-run")
    # and an operator's own selection, pasted from message data, is escaped when echoed
    pasted = ["--error-type", f"Timeout{clear}Error", "--replay-id", "pasted"]
    out, err = kmq_cli.output("replay", "-t", topic_name, "-g", GROUP, "--dry-run", *pasted)
    replayed += out + err  # the replay's first line goes to stderr
    assert "error type Timeout\\x1b[2JError" in replayed

    assert "Timeout\\x1b[2JError" in replayed  # the listing and the counts by error type
    for output in (listed, shown, replayed):
        assert not any(c in output for c in "\x1b\x07\r\x08\x9b\x85"), repr(output)
    assert "key=k\\x1b[2J" in listed and "failed\\x0d\\x1b[2J\\x9b2J\\x08" in listed
    assert "v\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J\\x85" in shown
    assert "h\\x1b[2J = \\x1b]52;c;cm0gLXJmIH4=\\x07" in shown


def test_a_markers_topic_deleted_under_a_tracker_and_a_worker_stops_both_with_one_line(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    group = group_of(topic_name)
    new_queue(settings, topic_name, group, partitions=2)
    markers = f"{topic_name}.{group}.markers"
    handled = tmp_path / "handled.txt"
    (tmp_path / "recording.py").write_text(
        "def handle(m):\n"
        f"    with open({str(handled)!r}, 'a') as f:\n"
        "        f.write(m.value.decode() + '\\n')\n"
    )
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "KMQ_SESSION_TIMEOUT_MS": "6000"}  # fmt: skip
    queue_args = ["-t", topic_name, "-g", group]
    worker_args = ["worker", *queue_args, "--handler", "recording:handle"]
    logs: dict[int, Path] = {}

    def start(*args: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{args[0]}-{len(logs)}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                kmq_argv(*args), env=env, cwd=tmp_path, stdout=out, stderr=out
            )
        logs[process.pid] = log
        return process

    tracker, worker = start("tracker", *queue_args), start(*worker_args)
    try:
        produce(settings, topic_name, [b"before"], partitions=2)
        assert wait_for(lambda: handled.exists() and "before" in handled.read_text(), 120)
        # the tracker fetches from both markers partitions (where the client crashed)
        tracker_log = logs[tracker.pid]
        assert wait_for(lambda: tracker_log.read_text().count("caught up") >= 2, 120)

        # when the markers topic is deleted under both, and a message arrives after it
        admin = admin_client(settings)
        admin.delete_topics([markers])[markers].result(30)
        produce(settings, topic_name, [b"after"], partitions=2)
        codes = [tracker.wait(120), worker.wait(120)]
    finally:
        for process in (tracker, worker):
            if process.poll() is None:
                stop(process, log=logs[process.pid])

    # then each stops with one error line naming the topic and the fix: no SIGSEGV (-11, 139)
    for process, code in zip((tracker, worker), codes, strict=True):
        err = logs[process.pid].read_text()
        assert code == 1, (code, err)
        errors = [line for line in err.splitlines() if line.startswith("kmq: error: ")]
        assert len(errors) == 1 and markers in errors[0] and "kmq provision" in errors[0], err
    # and the message that came after is not lost: handled already, or (never committed
    # without its start marker) handled by a worker once the queue is provisioned again
    new_queue(settings, topic_name, group, partitions=2)
    again = start(*worker_args)
    try:
        assert wait_for(lambda: "after" in handled.read_text().split(), 120)
    finally:
        stop(again, log=logs[again.pid])


def _topics(settings: KmqSettings) -> set[str]:
    return set(cluster_metadata(settings).topics)
