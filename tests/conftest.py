"""Shared fixtures: one real embedded broker per test session, unique topic names per test.

``KMQ_TEST_BOOTSTRAP=mock`` runs the kafka tests on librdkafka's mock cluster instead (a second
Kafka protocol implementation; see ``tests/mock_cluster.py`` for what it cannot do). Tests
marked ``embedded_broker_only`` are skipped there.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from kmq_dagster.audit.local_postgres import PostgresServer, fresh_database
from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.settings import KmqSettings
from tests.freeze_watchdog import (  # noqa: F401 (the watchdog's hooks)
    pytest_addoption,
    pytest_configure,
    pytest_runtest_protocol,
    pytest_unconfigure,
)
from tests.kafka_helpers import group_of
from tests.mock_cluster import MockCluster, mock_selected
from tests.support.kmq_cli import KmqCli

# Property tests check properties, not speed: on a loaded 2-core machine (the suite at -n 3
# beside other work) a slow example or slow input generation is the machine, not a failure
# (a unit run beside a CI run failed once on "Input generation is slow").
hypothesis_settings.register_profile(
    "kmq", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("kmq")

#: Fails a test that leaves a process running (and kills it); see its docstring.
pytest_plugins = ("tests.process_leaks",)

#: Fastest session timeout Apache Kafka accepts by default; group joins take ~3 s with it.
TEST_SESSION_TIMEOUT_MS = 6_000


@pytest.fixture(scope="session")
def broker() -> Iterator[Any]:
    """The embedded broker (in memory) on a free loopback port, stopped after the session;
    librdkafka's mock cluster with ``KMQ_TEST_BOOTSTRAP=mock``."""
    if mock_selected():
        cluster = MockCluster()
        mocked = pytest.MonkeyPatch()
        mocked.setattr("kmq_dagster.kafka.provision._create_topics", cluster.create_topics)
        yield cluster
        mocked.undo()
        cluster.stop()
        return
    with EmbeddedBroker(port=0) as embedded:
        yield embedded


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not mock_selected():
        return
    skip = pytest.mark.skip(reason="needs the embedded broker (KMQ_TEST_BOOTSTRAP=mock)")
    for item in items:
        if "embedded_broker_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def settings(broker: EmbeddedBroker) -> KmqSettings:
    """Settings pointing at the session's broker."""
    return KmqSettings(
        bootstrap_servers=broker.bootstrap_servers,
        session_timeout_ms=TEST_SESSION_TIMEOUT_MS,
    )


@pytest.fixture
def bootstrap_env(settings: KmqSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's broker in ``KMQ_BOOTSTRAP_SERVERS`` for the test: what ``kmq`` commands
    run in-process (``main([...])``) connect to."""
    monkeypatch.setenv("KMQ_BOOTSTRAP_SERVERS", settings.bootstrap_servers)


@pytest.fixture
def kmq_cli(bootstrap_env: None, capsys: pytest.CaptureFixture[str]) -> KmqCli:
    """``kmq`` commands run in-process against the session's broker, their output captured."""
    return KmqCli(capsys)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (tests share one broker)."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:60].strip("-")
    return f"{stem}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def group(topic_name: str) -> str:
    """The test's own consumer group (see :func:`tests.kafka_helpers.group_of`)."""
    return group_of(topic_name)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server on a free loopback port, for the whole session."""
    server = PostgresServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, or a fresh database on the session's PostgreSQL
    (the audit store and console tests run once on each)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'audit.db'}"
        return
    yield fresh_database(request.getfixturevalue("postgres_url"))


@pytest.fixture(autouse=True)
def private_audit_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test (and every kmq process it starts) audits into its own SQLite file,
    never into the user's ``~/.kmq``."""
    url = f"sqlite:///{tmp_path / 'kmq-audit.db'}"
    monkeypatch.setenv("KMQ_AUDIT_URL", url)
    return url


@pytest.fixture
def exporter() -> Iterator[Any]:
    """An OpenTelemetry ``InMemorySpanExporter`` holding the spans kmq makes during the test:
    kmq traces into an SDK provider of its own (OpenTelemetry's global provider can be set
    once per process), handed back when the test ends. Imported here only when a test asks."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kmq_dagster.tracing import use_tracer_provider

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    use_tracer_provider(provider)
    try:
        yield spans
    finally:
        use_tracer_provider(None)
        provider.shutdown()
