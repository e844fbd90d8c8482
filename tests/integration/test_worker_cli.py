"""`kmq worker` and `kmq tracker`: retry flags, bad arguments and missing topics."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.headers import DLQ_REASON, ERROR_MESSAGE, header_value, normalize_headers
from kmq_dagster.core.markers import StartMarker, decode_marker
from kmq_dagster.core.naming import dlq_topic, markers_topic, retry_topic
from kmq_dagster.core.retry_headers import ATTEMPT
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import group_of, new_queue, produce, read_topic, wait_for
from tests.processes import kmq_argv, run_kmq

pytestmark = pytest.mark.kafka

REPO_ROOT = Path(__file__).resolve().parents[2]
HANDLER = "tests.support.flaky_handler:handle"


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("no_colon", "--handler: a handler is named package.module:function"),
        ("no.such.module:f", "--handler: cannot import handler module 'no.such.module'"),
        ("json:no_such_function", "--handler: json has no callable 'no_such_function'"),
    ],
)
def test_bad_handler_is_a_one_line_error(settings: KmqSettings, handler: str, message: str) -> None:
    result = run_kmq(
        "worker", "-t", "x", "-g", "g", "--handler", handler,
        env={"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers},
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith(f"kmq: error: {message}")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["worker", "tracker"])
def test_unprovisioned_queue_is_a_one_line_error(
    settings: KmqSettings, topic_name: str, group: str, command: str
) -> None:
    extra = ["--handler", "json:dumps"] if command == "worker" else []
    result = run_kmq(
        command, "-t", topic_name, "-g", group, *extra,
        env={"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers},
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"run `kmq provision --topic {topic_name} --group {group}` first" in result.stderr


def test_worker_with_exponential_backoff_retries_on_its_backoff_topics(
    settings: KmqSettings, topic_name: str, group: str, tmp_path: Path
) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "KMQ_SESSION_TIMEOUT_MS": "6000"}
    backoff = ("--retry-backoff", "1s,2,3s", "--max-attempts", "4")
    provisioned = run_kmq(
        "provision", "-t", topic_name, "-p", "1", "-g", group, "--no-delay-queue", *backoff, env=env
    )
    assert provisioned.returncode == 0, provisioned.stderr
    retry_topics = [retry_topic(topic_name, group, ms) for ms in (1_000, 2_000, 3_000)]
    assert all(f"created  {name} " in provisioned.stdout for name in retry_topics)
    produce(settings, topic_name, [b"doomed"])
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        kmq_argv("worker", "-t", topic_name, "-g", group, "--handler", HANDLER),
        cwd=REPO_ROOT,
        env={
            **os.environ,
            **env,
            "KMQ_TEST_FAILURE_RATE": "1",
            "KMQ_TEST_OUTPUT_DIR": str(tmp_path),
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        (dead,) = read_topic(settings, dlq_topic(topic_name, group), 1, at_least=1, timeout_s=60)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    assert header_value(normalize_headers(dead.headers()), DLQ_REASON) == (
        b"failed 4 attempts, the last with FlakyDependencyError"
    )
    attempts = [
        header_value(normalize_headers(r.headers()), ATTEMPT)
        for name in retry_topics
        for r in read_topic(settings, name, 1, at_least=1)
    ]
    assert attempts == [b"2", b"3", b"4"]  # one hop per backoff step: 1s, 2s, then capped at 3s


def test_conflicting_retry_flags_are_a_one_line_error(settings: KmqSettings) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    base = ("provision", "-t", "x", "-g", "g")
    both = run_kmq(*base, "--retry-delays", "1s", "--retry-backoff", "1s,2,1m", env=env)
    bad = run_kmq(*base, "--retry-backoff", "1s,2", env=env)
    stray = run_kmq(*base, "--max-attempts", "3", env=env)

    assert both.stderr.strip() == (
        "kmq: error: --retry-backoff: give retry delays or a retry backoff, not both"
    )
    assert bad.stderr.strip().startswith("kmq: error: --retry-backoff")
    assert "INITIAL,MULTIPLIER,MAX" in bad.stderr
    assert stray.stderr.strip().startswith(
        "kmq: error: --max-attempts: max attempts go with a retry backoff"
    )
    assert {both.returncode, bad.returncode, stray.returncode} == {1}


def held_messages_extended(settings: KmqSettings, topic: str) -> bool:
    """Whether a worker of the test's group extended a message's visibility: a start marker for
    one message (a fetch writes one per run of the batch, here one for all 200)."""
    records = read_topic(settings, markers_topic(topic, group_of(topic)), 1, timeout_s=3)
    markers = [decode_marker(r.value() or b"") for r in records]
    return any(isinstance(m, StartMarker) and m.count == 1 for m in markers)


def test_worker_breaker_stops_a_failure_flood_and_raises_an_alert(
    settings: KmqSettings, topic_name: str, group: str, tmp_path: Path, private_audit_store: str
) -> None:
    env = {"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "KMQ_SESSION_TIMEOUT_MS": "6000"}
    delays = ("--retry-delays", "1m")
    provisioned = run_kmq("provision", "-t", topic_name, "-p", "1", "-g", group, *delays,
                          "--visibility-timeout", "3s", env=env)  # fmt: skip
    assert provisioned.returncode == 0, provisioned.stderr
    produce(settings, topic_name, [str(i).encode() for i in range(200)])
    log = (tmp_path / "worker.log").open("wb")
    failing = {"KMQ_TEST_FAILURE_RATE": "1", "KMQ_TEST_OUTPUT_DIR": str(tmp_path)}
    worker = subprocess.Popen(
        kmq_argv("worker", "-t", topic_name, "-g", group, "--handler", HANDLER,
                 "--breaker", "--breaker-min-calls", "5", "--breaker-cooldown", "5m"),
        cwd=REPO_ROOT,
        env={**os.environ, **env, **failing},
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    store = AuditStore(private_audit_store)
    try:
        assert wait_for(lambda: store.alerts(queue_topic=topic_name), timeout_s=60)
        # it keeps running with the breaker open: it extends the visibility of what it holds
        assert wait_for(lambda: held_messages_extended(settings, topic_name), timeout_s=30)
        # but calls the handler no more: 4 failures retried, the 5th opened the breaker
        calls = b"".join(path.read_bytes() for path in tmp_path.glob("calls-*.log"))
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    (alert,) = store.alerts(queue_topic=topic_name)
    assert alert.severity == "critical"
    assert alert.message.startswith("circuit breaker closed -> open: error rate 100%")
    copies = read_topic(settings, retry_topic(topic_name, group, 60_000), 1, timeout_s=3)
    # the first 4 failures were retried; the 5th opened the breaker and waits with the rest
    assert len(copies) == 4, "the flood reached the retry topic"
    assert calls.count(b"\n") == 5, "the handler was called while the breaker was open"
    assert "circuit breaker of" in (tmp_path / "worker.log").read_text()


def test_log_json_writes_one_json_object_per_log_line(
    settings: KmqSettings, topic_name: str, group: str, tmp_path: Path
) -> None:
    import json

    new_queue(settings, topic_name, group)
    log_path = tmp_path / "tracker.log"
    tracker = subprocess.Popen(
        kmq_argv("tracker", "-t", topic_name, "-g", group, "--log-json"),
        env={**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
             "KMQ_SESSION_TIMEOUT_MS": "6000"},
        stdout=subprocess.DEVNULL, stderr=log_path.open("wb"),
    )  # fmt: skip
    try:
        assert wait_for(lambda: "caught up" in log_path.read_text(), timeout_s=60)
    finally:
        tracker.send_signal(signal.SIGTERM)
        assert tracker.wait(timeout=60) == 0
    entries = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert {"time", "level", "logger", "message"} <= set(entries[0])
    assert any("caught up" in entry["message"] for entry in entries)


def start_worker(
    settings: KmqSettings, topic: str, group: str, tmp_path: Path, handler: str, *flags: str
) -> subprocess.Popen[bytes]:
    """``kmq worker`` on ``topic`` with ``handler`` (its output files in ``tmp_path``, its
    stderr in ``worker.log`` there); the caller stops it."""
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "KMQ_SESSION_TIMEOUT_MS": "6000", "KMQ_TEST_OUTPUT_DIR": str(tmp_path)}  # fmt: skip
    return subprocess.Popen(
        kmq_argv("worker", "-t", topic, "-g", group, "--handler", handler, *flags),
        cwd=REPO_ROOT, env=env, stderr=(tmp_path / "worker.log").open("wb"),
    )  # fmt: skip


def test_an_async_handler_runs_for_every_message(
    settings: KmqSettings, topic_name: str, group: str, tmp_path: Path
) -> None:
    # given 20 messages and `kmq worker` with an `async def` handler
    new_queue(settings, topic_name, group)
    produce(settings, topic_name, [str(i).encode() for i in range(20)])
    handled = tmp_path / "handled.txt"
    worker = start_worker(
        settings, topic_name, group, tmp_path, "tests.support.async_handlers:record"
    )
    try:
        # then its coroutine ran (past its await) for each of them
        assert wait_for(
            lambda: handled.exists() and len(handled.read_text().splitlines()) >= 20,
            timeout_s=60,
        ), (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert sorted(map(int, handled.read_text().split())) == list(range(20))


@pytest.mark.parametrize(("flags", "threshold"), [([], 10_000), (["--gc-threshold", "0"], 700)])
def test_gc_threshold_sets_the_collector_the_handler_runs_under_and_0_leaves_it_alone(
    settings: KmqSettings,
    topic_name: str,
    group: str,
    tmp_path: Path,
    flags: list[str],
    threshold: int,
) -> None:
    # given a message and `kmq worker` in a process with CPython's default thresholds
    new_queue(settings, topic_name, group)
    produce(settings, topic_name, [b"first"])
    seen = tmp_path / "gc_threshold.txt"
    worker = start_worker(
        settings, topic_name, group, tmp_path, "tests.support.gc_threshold_handler:record", *flags
    )
    try:
        # then the handler ran under the threshold the flag asked for
        assert wait_for(seen.exists, timeout_s=60), (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert seen.read_text().split() == [str(threshold)]


def test_a_generator_handler_is_a_one_line_error(
    settings: KmqSettings, topic_name: str, group: str
) -> None:
    new_queue(settings, topic_name, group)
    result = run_kmq(
        "worker", "-t", topic_name, "-g", group, "--handler", "tests.support.async_handlers:steps",
        env={"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers},
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "handler steps is a generator function" in result.stderr.splitlines()[-1]


@pytest.mark.parametrize("concurrency", ["1", "4"])
def test_a_handler_exception_that_cannot_be_rendered_is_dead_lettered_not_a_crash(
    settings: KmqSettings, topic_name: str, group: str, tmp_path: Path, concurrency: str
) -> None:
    # given poison messages whose handler raises an unprintable exception or GeneratorExit
    new_queue(settings, topic_name, group, retry_delays_ms=(100,))
    values = [b"unprintable", b"generator-exit", *(b"ok-%d" % i for i in range(10))]
    produce(settings, topic_name, values)
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "KMQ_SESSION_TIMEOUT_MS": "6000", "KMQ_TEST_OUTPUT_DIR": str(tmp_path)}  # fmt: skip
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        kmq_argv("worker", "-t", topic_name, "-g", group, "--concurrency", concurrency,
                 "--handler", "tests.support.hostile_handlers:handle",
                 "--non-retryable", "Unprintable,GeneratorExit"),
        cwd=REPO_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    handled = tmp_path / "handled.txt"
    try:
        # when the worker meets them, then both reach the DLQ with a reason
        dead = read_topic(settings, dlq_topic(topic_name, group), 1, at_least=2, timeout_s=60)
        assert wait_for(
            lambda: handled.exists() and len(handled.read_text().split()) >= 10, timeout_s=60
        ), log.read_text()[-3000:]
        assert worker.poll() is None, log.read_text()[-3000:]  # and the worker lives on
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()[-3000:]
    reasons = {r.value(): header_value(normalize_headers(r.headers()), DLQ_REASON) for r in dead}
    assert reasons == {
        b"unprintable": b"non-retryable error Unprintable",
        b"generator-exit": b"non-retryable error GeneratorExit",
    }
    messages = [header_value(normalize_headers(r.headers()), ERROR_MESSAGE) for r in dead]
    assert b"<Unprintable: str() raised RuntimeError>" in messages
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    ("command", "stop_signal", "exit_code"),
    [
        ("worker", signal.SIGINT, 130),
        ("tracker", signal.SIGINT, 130),
        ("worker", signal.SIGTERM, 0),
        ("tracker", signal.SIGTERM, 0),
    ],
)
def test_ctrl_c_exits_130_and_sigterm_0_after_a_clean_stop(
    settings: KmqSettings,
    topic_name: str,
    group: str,
    tmp_path: Path,
    command: str,
    stop_signal: signal.Signals,
    exit_code: int,
) -> None:
    # given a running worker (it has handled a message) or a tracker that caught up
    new_queue(settings, topic_name, group)
    produce(settings, topic_name, [b"1"])
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "KMQ_SESSION_TIMEOUT_MS": "6000", "KMQ_TEST_OUTPUT_DIR": str(tmp_path)}  # fmt: skip
    extra = ["--handler", "tests.support.async_handlers:record"] if command == "worker" else []
    log = tmp_path / f"{command}.log"
    process = subprocess.Popen(
        kmq_argv(command, "-t", topic_name, "-g", group, "-v", *extra),
        cwd=REPO_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    handled = tmp_path / "handled.txt"
    try:
        ready = handled.exists if command == "worker" else lambda: "caught up" in log.read_text()
        assert wait_for(ready, timeout_s=60), log.read_text()[-3000:]
    finally:
        # when it is stopped, then it exits with the code README gives, without a traceback
        process.send_signal(stop_signal)
        assert process.wait(timeout=60) == exit_code, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
    assert f"kmq {command}: stopped" in log.read_text()


@pytest.mark.parametrize(
    ("stop_signal", "exit_code", "line"),
    [(signal.SIGTERM, 0, "kmq: stopped while starting"), (signal.SIGINT, 130, "kmq: aborted")],
)
def test_a_worker_stopped_while_it_starts_exits_with_a_clean_stops_code(
    settings: KmqSettings,
    topic_name: str,
    group: str,
    tmp_path: Path,
    stop_signal: signal.Signals,
    exit_code: int,
    line: str,
) -> None:
    # given a worker still importing its handler module (before it sets up its own stop)
    new_queue(settings, topic_name, group)
    env = {**os.environ, "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "KMQ_TEST_OUTPUT_DIR": str(tmp_path)}  # fmt: skip
    log = tmp_path / "worker.log"
    process = subprocess.Popen(
        kmq_argv("worker", "-t", topic_name, "-g", group,
                 "--handler", "tests.support.slow_import_handler:handle"),
        cwd=REPO_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert wait_for((tmp_path / "importing").exists, timeout_s=60), log.read_text()[-3000:]
        # when it is asked to stop
        process.send_signal(stop_signal)
        # then it exits at once with the code a clean stop exits with (SIGTERM: 0, not 143),
        # saying so in one line, without a traceback
        assert process.wait(timeout=30) == exit_code, log.read_text()[-3000:]
    finally:
        (tmp_path / "go").touch()  # a child left running imports on and is stopped below
        if process.poll() is None:
            process.kill()
            process.wait()
    assert line in log.read_text()
    assert "Traceback" not in log.read_text()
