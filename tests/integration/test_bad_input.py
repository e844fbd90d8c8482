"""Every bad input issue 13 found, as a new user would type it: one ``kmq: error:`` line, the
right exit code, no traceback, nothing sent, nothing silently accepted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kmq_dagster.cli import main
from kmq_dagster.kafka.topic_reader import count_records
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import group_of, new_queue, produce, read_topic
from tests.processes import kmq_argv

pytestmark = pytest.mark.kafka

#: Stands in CASES for the queue's group, the test's own (group_of its topic).
GROUP = "<group>"


@pytest.fixture
def queue_topic(settings: KmqSettings, topic_name: str, bootstrap_env: None) -> str:
    new_queue(settings, topic_name, partitions=1, delay_queue=True)
    return topic_name


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    _out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, err


CASES = [
    # (argv after "--topic T", the error line's start)
    (["worker", "-g", GROUP, "--handler", "json:loads", "--breaker", "--breaker-window", "0s"],
     "--breaker-window: '0s' is outside 1ms to 7d"),
    (["worker", "-g", GROUP, "--handler", "json:loads", "--breaker-cooldown", "0s"],
     "--breaker-cooldown: '0s' is outside"),
    (["worker", "-g", GROUP, "--handler", "json:loads", "--breaker-error-rate", "nan"],
     "--breaker-error-rate: 'nan' is not in (0, 1]"),
    (["provision", "-g", "other", "--retry-jitter", "nan"],
     "--retry-jitter: 'nan' is not in [0, 1)"),
    (["provision", "-g", "other", "--visibility-timeout", "99999999999999999999d"],
     "--visibility-timeout:"),
    (["provision", "-g", "other", "--retry-backoff", "1s,nan,10m"], "--retry-backoff:"),
    (["provision", "-g", "other", "--retry-backoff", "1s,1e308,10m", "--max-attempts", "0"],
     "--max-attempts:"),
    (["provision", "-g", "other", "--retry-delays", ""], "--retry-delays: retry delays are"),
    (["discard", "-g", GROUP, "--since", "1000000d"], "--since:"),
    (["discard", "-g", GROUP, "--since", "0001-01-01T00:00:00+01:00"],
     "--since: '0001-01-01T00:00:00+01:00' is outside the years 1970 to 9999"),
    (["provision", "-X", "bogus.setting=1"],
     "-X: the Kafka client refused its settings: No such configuration property"),
    (["provision", "-g", GROUP, "--visibility-timeout", "10m"],
     "queue "),  # contradicts the stored 30s: an error, not a silent override
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), CASES)
def test_bad_values_are_one_error_line_with_exit_code_1(
    queue_topic: str, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    own = [group_of(queue_topic) if arg == GROUP else arg for arg in args[1:]]
    code, err = run([args[0], "--topic", queue_topic, *own], capsys)

    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith(f"kmq: error: {message}"), err


@pytest.mark.parametrize(
    "url",
    ["garbage://x", "postgresql+asyncpg://u@h/db", "sqlite:////nonexistent/dir/a.db", "sqlite:///"],
)
def test_unusable_audit_stores_are_one_error_line(
    queue_topic: str, url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KMQ_AUDIT_URL", url)

    code, err = run(["discard", "-t", queue_topic, "-g", group_of(queue_topic)], capsys)

    assert code == 1 and err.count("\n") == 1 and err.startswith("kmq: error: "), err


@pytest.mark.parametrize("topic", ["", "..", "a b", "x" * 300])
def test_send_refuses_illegal_or_unknown_topic_names_and_sends_nothing(
    queue_topic: str, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(["send", "--topic", topic, "--value", "m"], capsys)

    assert code == 1 and err.count("\n") == 1, err
    assert "illegal topic name" in err or "Kafka allows 249" in err, err


def test_send_to_a_topic_that_does_not_exist_creates_nothing(
    settings: KmqSettings, queue_topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(["send", "--topic", f"{queue_topic}-typo", "--value", "m"], capsys)

    assert code == 1 and "does not exist" in err
    assert f"{queue_topic}-typo" not in _topics(settings)


def test_non_utf8_lines_on_stdin_are_sent_as_the_bytes_they_are(
    settings: KmqSettings, queue_topic: str
) -> None:
    lines = b"first\n\xff\xfe binary\nlast\n"

    result = subprocess.run(
        kmq_argv("send", "--topic", queue_topic), input=lines, capture_output=True, check=False,
        env={**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers},
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"sent 3 messages to {queue_topic}".encode()
    values = [r.value() for r in read_topic(settings, queue_topic, 1, at_least=3)]
    assert values == [b"first", b"\xff\xfe binary", b"last"]


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("def handle(m) -> None\n    pass\n", "has a syntax error"),
        ("raise RuntimeError('no config')\n", "raised RuntimeError: no config"),
    ],
)
def test_a_handler_module_that_cannot_load_is_one_error_line(
    queue_topic: str,
    tmp_path: Path,
    module: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "brokenhandler.py").write_text(module)
    monkeypatch.chdir(tmp_path)  # found from the current directory, as python -m would
    monkeypatch.delitem(sys.modules, "brokenhandler", raising=False)

    group = group_of(queue_topic)

    code, err = run(
        ["worker", "-t", queue_topic, "-g", group, "--handler", "brokenhandler:handle"], capsys
    )

    assert code == 1 and err.startswith("kmq: error: --handler: ") and message in err, err


def test_a_handler_exiting_with_a_code_ends_the_worker_with_that_code_and_loses_nothing(
    settings: KmqSettings, queue_topic: str, tmp_path: Path
) -> None:
    (tmp_path / "exiting.py").write_text("import sys\ndef handle(m):\n    sys.exit(3)\n")
    produce(settings, queue_topic, [b"job"])
    group = group_of(queue_topic)

    result = subprocess.run(
        kmq_argv("worker", "-t", queue_topic, "-g", group, "--handler", "exiting:handle"),
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
             "KMQ_SESSION_TIMEOUT_MS": "6000"},
    )  # fmt: skip

    assert result.returncode == 3, result.stderr
    assert "the handler asked to exit with code 3" in result.stderr
    assert count_records(settings, f"{queue_topic}.{group}.dlq", 1) == 0  # not dead-lettered


def test_options_for_kafka_go_before_or_after_the_command(
    settings: KmqSettings, queue_topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = "127.0.0.1:1"
    before = main(["-b", wrong, "-X", "socket.timeout.ms=2000", "provision", "-t", queue_topic])
    err_before = capsys.readouterr().err
    after = main(["provision", "-t", queue_topic, "-b", settings.bootstrap_servers])

    assert before == 1 and f"cannot reach Kafka at {wrong}" in err_before
    assert after == 0
    help_text = subprocess.run(
        kmq_argv("replay", "--help"), capture_output=True, text=True, check=False
    ).stdout
    assert "--bootstrap-servers" in help_text and "-X KEY=VALUE" in help_text


def _topics(settings: KmqSettings) -> set[str]:
    from kmq_dagster.kafka.clients import cluster_metadata

    return set(cluster_metadata(settings).topics)
