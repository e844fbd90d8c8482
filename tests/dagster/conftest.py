"""Fixtures for the Dagster tests: resources on the session's broker, a test instance, one
local Spark session shared by every processing run, and a sensor tick helper."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from dagster import DagsterInstance, Definitions, SensorDefinition, build_sensor_context
from dagster import instance_for_test as dagster_instance_for_test
from dagster_pyspark import PySparkResource
from pyspark.sql import SparkSession

from kmq_dagster.defs.resources import AuditStoreResource, KmqResource, local_pyspark_resource
from kmq_dagster.settings import KmqSettings
from tests.conftest import TEST_SESSION_TIMEOUT_MS

if TYPE_CHECKING:
    from tests.dagster.helpers import QueueUnderTest


@pytest.fixture
def kmq(settings: KmqSettings) -> KmqResource:
    return KmqResource(
        bootstrap_servers=settings.bootstrap_servers, session_timeout_ms=TEST_SESSION_TIMEOUT_MS
    )


@pytest.fixture
def audit(private_audit_store: str) -> AuditStoreResource:
    return AuditStoreResource(url=private_audit_store)


@pytest.fixture(scope="session")
def pyspark() -> Iterator[PySparkResource]:
    """dagster-pyspark's resource; its session (local[2]) is created by the first run and
    shared by the later ones (getOrCreate), then stopped here."""
    yield local_pyspark_resource("kmq-dagster-tests")
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with dagster_instance_for_test() as test_instance:
        yield test_instance


@pytest.fixture
def demo(
    topic_name: str,
    tmp_path: Path,
    instance: DagsterInstance,
    kmq: KmqResource,
    audit: AuditStoreResource,
) -> QueueUnderTest:
    """The demo pricing queue on the test's topic as :func:`~tests.dagster.helpers.declare`
    declares it by default, provisioned (for a test that needs no other field)."""
    from tests.dagster.helpers import declare  # it imports tick from here

    return declare(topic_name, tmp_path, instance, kmq, audit)


def tick(
    sensor: SensorDefinition,
    defs: Definitions,
    instance: DagsterInstance,
    resources: dict[str, Any],
    cursor: str | None = None,
) -> Any:
    """One evaluation of ``sensor`` as the daemon would run it."""
    with build_sensor_context(
        instance=instance, definitions=defs, resources=resources, cursor=cursor
    ) as context:
        return sensor(context)
