"""``kmq console`` as a real process: it refuses an unsafe or unusable setup in one line,
``add-user`` writes the users file, the console serves from the installed package, and it
works on the Kafka that ``-b`` and ``-X`` name."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.broker.ports import free_port
from kmq_dagster.child_processes import is_running
from kmq_dagster.console import jobs
from kmq_dagster.console.auth import OPERATOR, Principal, UsersFile
from kmq_dagster.core.naming import redelivery_topic
from kmq_dagster.kafka.provision_plan import partition_counts
from kmq_dagster.kafka.topic_reader import count_records
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.settings import KmqSettings
from tests.console.apps import button, open_app, texts
from tests.console.test_dead_letters_page import apply_filters, select_rows
from tests.kafka_helpers import new_queue, produce_dead_letters, wait_for
from tests.processes import kmq_argv, run_kmq, stop

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment with its own HOME (no ~/.streamlit/secrets.toml, no ~/.kmq users)."""
    return {"HOME": str(tmp_path), "KMQ_CONSOLE_USERS_FILE": str(tmp_path / "users.json")}


def test_no_auth_on_a_non_loopback_address_is_refused(home: dict[str, str]) -> None:
    result = run_kmq("console", "--no-auth", "--address", "0.0.0.0", env=home)

    assert result.returncode == 1
    assert result.stderr.startswith("kmq: error: --no-auth serves on a loopback address only")
    assert "Traceback" not in result.stderr


def test_a_console_nobody_could_log_in_to_is_refused(home: dict[str, str]) -> None:
    result = run_kmq("console", env=home)

    assert result.returncode == 1
    assert "nobody can log in" in result.stderr and "kmq console add-user" in result.stderr


def test_add_user_writes_a_user_who_can_log_in(home: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run(
        kmq_argv("console", "add-user", "olivia", "--role", "operator", "--password-stdin"),
        input="a long enough password\n", env={**os.environ, **home}, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert "olivia is an operator" in result.stdout
    users = UsersFile(tmp_path / "users.json")
    assert users.authenticate("olivia", "a long enough password") == Principal("olivia", OPERATOR)
    short = run_kmq("console", "add-user", "x", "--role", "viewer", "--oidc", "--role", "nope",
                    env=home)  # fmt: skip
    assert short.returncode == 1 and "--role: 'nope' is not one of" in short.stderr


def test_the_console_serves_from_the_package_and_stops_on_sigterm(
    home: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    log = (tmp_path / "console.log").open("w")
    process = subprocess.Popen(
        kmq_argv("console", "--no-auth", "--port", str(port)),
        env={**os.environ, **home}, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert wait_for(lambda: _get(f"http://127.0.0.1:{port}/_stcore/health") == "ok", 60), (
            tmp_path / "console.log"
        ).read_text()
        assert "<title>" in (_get(f"http://127.0.0.1:{port}/") or "")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) is not None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        log.close()
    assert not is_running(process.pid)
    assert "serving on http://127.0.0.1" in (tmp_path / "console.log").read_text()


def test_a_malformed_x_setting_is_refused_before_the_console_starts(
    home: dict[str, str],
) -> None:
    result = run_kmq("-X", "no-equals-sign", "console", env=home)

    assert result.returncode == 1
    assert result.stderr.startswith("kmq: error: -X: client settings take NAME=VALUE")


@pytest.mark.kafka
def test_the_console_replays_onto_the_kafka_given_with_b_not_the_default_one(
    home: dict[str, str],
    tmp_path: Path,
    settings: KmqSettings,
    topic_name: str,
    private_audit_store: str,
    console_env: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given: three dead letters of a queue on the session's broker (a free port), ingested; the
    # environment names a Kafka where nothing listens, as a default a user overrides with -b
    group = "billing"
    queue = new_queue(settings, topic_name, group, partitions=2, retry_delays_ms=(1_000,))
    produce_dead_letters(settings, queue, [(f"k{i}", "TimeoutError") for i in range(3)])
    store = AuditStore(private_audit_store)
    ingester = DlqIngester(queue, store)
    ingester.ingest_available()
    ingester.close()
    nowhere = f"127.0.0.1:{free_port()}"
    port = free_port()

    # when: `kmq -b BROKER -X ... console` serves
    log = (tmp_path / "console.log").open("w")
    process = subprocess.Popen(
        kmq_argv("-b", settings.bootstrap_servers, "-X", "client.id=kmq-console-test",
                 "console", "--no-auth", "--port", str(port)),
        env={**os.environ, **home, "KMQ_BOOTSTRAP_SERVERS": nowhere}, cwd=tmp_path,
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert wait_for(lambda: _get(f"http://127.0.0.1:{port}/_stcore/health") == "ok", 60), (
            tmp_path / "console.log"
        ).read_text()
        # The console became Streamlit in the same process: its environment is what every
        # page of it reads its Kafka settings from.
        served_with = _environment(process.pid)
    finally:
        stop(process)
        log.close()
    assert not is_running(process.pid)
    kafka = KmqSettings.from_env(served_with)
    assert kafka.bootstrap_servers == settings.bootstrap_servers
    assert kafka.client_config["client.id"] == "kmq-console-test"

    # then: its Dead letters page, with that environment, replays them onto that broker
    for name, value in served_with.items():
        if name.startswith("KMQ_"):
            monkeypatch.setenv(name, value)
    app = open_app(Principal("olivia", OPERATOR), page="dead letters")
    apply_filters(app, queue=f"{topic_name} / {group}")
    select_rows(app, [0, 1, 2])
    app.run()
    button(app, "Replay selected (3)").click().run()
    button(app, "Dry run").click().run()
    button(app, "Replay 3 dead letters").click().run()
    target = redelivery_topic(topic_name, group)
    assert f"3 dead letters to {target}" in texts(app)
    (job,) = [j for j in jobs.jobs() if j.queue_topic == topic_name]
    assert wait_for(lambda: job.state != jobs.RUNNING, timeout_s=60), job
    assert (job.state, job.replayed) == (jobs.FINISHED, 3)
    assert count_records(settings, target, partitions=partition_counts(settings)[target]) == 3
    assert store.count_dead_letters(DeadLetterFilter(status="replayed")) == 3
    store.close()


@pytest.mark.slow
def test_the_wheel_ships_the_console_app_and_its_pages(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("kmq_dagster-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())

    for page in ("app.py", "views/overview.py", "views/dead_letters.py", "views/actions.py",
                 "views/breakers.py"):  # fmt: skip
        assert f"kmq_dagster/console/{page}" in names


def _environment(pid: int) -> dict[str, str]:
    """The environment process ``pid`` runs with (Linux)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(entry.split("=", 1) for entry in raw.split("\0") if "=" in entry)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None
