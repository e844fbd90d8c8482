"""Several KmqQueueComponent defs.yaml files in one dg project, loaded the way ``dg`` loads a
project (Dagster's component sandbox, the whole defs folder at once, and the example project's
own defs folder): the queues load together on one set of resources, and a real conflict
between two files is one error naming both files and the field."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from dagster import (
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    build_resources,
    load_from_defs_folder,
)
from dagster.components.testing import create_defs_folder_sandbox

from kmq_dagster import KmqQueueComponent, Queue
from kmq_dagster.defs import QueueSpec, kmq_definitions
from kmq_dagster.defs.alerts import KMQ_TAG_PREFIX
from kmq_dagster.errors import ConfigError
from tests.dagster.test_queue_component import COMPONENT, causes, names

EXAMPLE_SRC = Path(__file__).resolve().parents[2] / "examples" / "kmq-orders" / "src"

#: The resources ``dg scaffold defs kmq_dagster.KmqQueueComponent NAME`` writes in every file.
SCAFFOLDED_RESOURCES: dict[str, Any] = {
    "kafka": {"bootstrap_servers": "{{ env.KMQ_BOOTSTRAP_SERVERS }}"},
    "audit": {"url": "{{ env.KMQ_AUDIT_URL }}"},
}


def queue_file(topic: str, group: str, **more: Any) -> dict[str, Any]:
    """A defs.yaml's attributes with one queue and the scaffolded resources."""
    return {"queues": [{"topic": topic, "group": group}], "resources": SCAFFOLDED_RESOURCES, **more}


@contextmanager
def project(files: dict[str, dict[str, Any]]) -> Iterator[Definitions]:
    """The definitions of a dg project whose defs folder holds one defs.yaml per entry of
    ``files`` (folder name: attributes), built as ``dg check defs`` builds them."""
    with create_defs_folder_sandbox() as sandbox:
        for folder, attributes in files.items():
            sandbox.scaffold_component(
                component_cls=KmqQueueComponent,
                defs_path=folder,
                defs_yaml_contents={"type": COMPONENT, "attributes": attributes},
            )
        with sandbox.build_all_defs() as defs:
            yield defs


def load_error(files: dict[str, dict[str, Any]]) -> str:
    with pytest.raises(Exception) as raised, project(files):
        pass
    message = causes(raised.value)
    assert "different resources with same key" not in message, message  # Dagster's own
    return message


def test_two_queue_files_load_as_one_component_with_both_queues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KMQ_BOOTSTRAP_SERVERS", "kafka.example.com:9092")
    files = {"orders": queue_file("orders", "invoicing"), "payments": queue_file("payments", "b")}

    with project(files) as defs:
        both = [QueueSpec(Queue("orders", "invoicing")), QueueSpec(Queue("payments", "b"))]
        # the same assets, checks, jobs, sensors and schedules as both queues in one file,
        # the code location's daily jobs and run-failure sensor once
        assert names(defs) == names(kmq_definitions(both))
        assert {"track_orders__invoicing", "track_payments__b"} <= set(names(defs)["jobs"])
        # one set of resources, as declared, resolving for a run
        resources = defs.resources or {}
        assert set(resources) == {"kmq", "audit", "pyspark", "alerts"}
        with build_resources({"kmq": resources["kmq"]}) as initialized:
            assert initialized.kmq.get_settings().bootstrap_servers == "kafka.example.com:9092"
        # the run-failure sensor knows kmq's runs by their tags: every job carries one
        repository = defs.get_repository_def()
        untagged = [
            job.name
            for job in repository.get_all_jobs()
            if not job.name.startswith("__")
            and not any(tag.startswith(KMQ_TAG_PREFIX) for tag in job.tags)
        ]
        assert untagged == []


def test_a_second_scaffolded_queue_takes_the_resources_the_first_file_declares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_BROKERS", "kafka.example.com:9092")
    with create_defs_folder_sandbox() as sandbox:
        orders = sandbox.scaffold_component(component_cls=KmqQueueComponent, defs_path="orders")
        first = yaml.safe_load((orders / "defs.yaml").read_text())
        assert first["attributes"]["resources"] == SCAFFOLDED_RESOURCES
        # the user edits the first file's resources, then scaffolds a second queue
        first["attributes"]["resources"]["kafka"] = {"bootstrap_servers": "{{ env.KAFKA_BROKERS }}"}
        (orders / "defs.yaml").write_text(yaml.safe_dump(first))
        payments = sandbox.scaffold_component(
            component_cls=KmqQueueComponent,
            defs_path="payments",
            scaffold_params={"group": "billing"},
        )

        second = yaml.safe_load((payments / "defs.yaml").read_text())
        assert second["attributes"] == {
            "queues": [{"topic": "payments", "group": "billing", "partitions": 2}]
        }
        with sandbox.build_all_defs() as defs:
            resources = defs.resources or {}
            with build_resources({"kmq": resources["kmq"]}) as initialized:
                settings = initialized.kmq.get_settings()
            assert settings.bootstrap_servers == "kafka.example.com:9092"
            assert "track_payments__billing" in names(defs)["jobs"]


def test_a_file_leaving_out_a_resource_takes_the_one_another_file_declares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOOK", "https://hooks.example.com/kmq")
    orders = queue_file("orders", "invoicing", audit_retention_schedule="running")
    orders["resources"] = {**SCAFFOLDED_RESOURCES, "alerts": {"webhook_url": "{{ env.HOOK }}"}}
    # "accounts" loads first: what it leaves out is not yet declared when it builds
    accounts = {"queues": [{"topic": "accounts", "group": "g"}], "sensors": "stopped"}
    files = {"accounts": accounts, "orders": orders}

    with project(files) as defs:
        resources = defs.resources or {}
        with build_resources({"alerts": resources["alerts"]}) as initialized:
            assert initialized.alerts.webhook_url == "https://hooks.example.com/kmq"
        repository = defs.get_repository_def()
        retention = repository.get_schedule_def("kmq_audit_retention_daily")
        assert retention.default_status == DefaultScheduleStatus.RUNNING
        # sensors: per file; the shared failure sensor runs unless every file stops its sensors
        status = {sensor.name: sensor.default_status for sensor in repository.sensor_defs}
        assert status["observe_accounts__g"] == DefaultSensorStatus.STOPPED
        assert status["observe_orders__invoicing"] == DefaultSensorStatus.RUNNING
        assert status["kmq_run_failures"] == DefaultSensorStatus.RUNNING
        assert {"track_accounts__g", "track_orders__invoicing"} <= set(names(defs)["jobs"])


def test_the_failure_sensor_is_stopped_when_every_file_stops_its_sensors() -> None:
    files = {name: queue_file(name, "g", sensors="stopped") for name in ("accounts", "orders")}
    with project(files) as defs:
        failures = defs.get_repository_def().get_sensor_def("kmq_run_failures")
        assert failures.default_status == DefaultSensorStatus.STOPPED


@pytest.mark.parametrize(
    ("payments", "field"),
    [
        (
            {"resources": {**SCAFFOLDED_RESOURCES, "kafka": {"bootstrap_servers": "other:9092"}}},
            "resources.kafka.bootstrap_servers",
        ),
        (
            {"resources": {"alerts": {"slack_channel": "#payments"}}},
            "resources.alerts.slack_channel",
        ),
        ({"audit_retention_schedule": "running"}, "audit_retention_schedule"),
    ],
    ids=["broker", "alerts", "retention schedule"],
)
def test_two_files_declaring_a_shared_setting_differently_are_one_error_naming_both(
    payments: dict[str, Any], field: str
) -> None:
    orders = queue_file("orders", "invoicing", audit_retention_schedule="stopped")
    orders["resources"] = {**SCAFFOLDED_RESOURCES, "alerts": {"slack_channel": "#orders"}}

    message = load_error(
        {"orders": orders, "payments": {**queue_file("payments", "b"), **payments}}
    )

    assert f"orders/defs.yaml and payments/defs.yaml declare different {field}:" in message, message


def test_one_queue_declared_in_two_files_is_one_error_naming_both() -> None:
    message = load_error(
        {"orders": queue_file("orders", "invoicing"), "more": queue_file("orders", "invoicing")}
    )

    assert "both declare the queue 'orders / invoicing'" in message, message
    assert "more/defs.yaml" in message and " orders/defs.yaml" in message, message


def test_two_files_giving_one_dagster_name_are_one_error_naming_both() -> None:
    # orders.eu / x and orders_eu / x are different queues with one default Dagster name
    message = load_error(
        {"eu": queue_file("orders.eu", "x"), "eu_too": queue_file("orders_eu", "x")}
    )

    assert "both give a queue the Dagster name 'orders_eu__x'" in message, message
    assert "eu/defs.yaml" in message and "eu_too/defs.yaml" in message, message


def test_one_queue_declared_twice_in_one_file_is_refused() -> None:
    twice = {"queues": [{"topic": "orders", "group": "g"}, {"topic": "orders", "group": "g"}]}
    with pytest.raises(Exception) as raised, project({"orders": twice}):
        pass
    assert isinstance(raised.value.__cause__, ConfigError)
    assert "queue orders / g is declared twice" in causes(raised.value)


def test_the_example_project_loads_its_two_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    try:
        defs = load_from_defs_folder(path_within_project=EXAMPLE_SRC / "kmq_orders")
        listed = names(defs)
    finally:
        for module in [name for name in sys.modules if name.startswith("kmq_orders")]:
            del sys.modules[module]

    assert {"kmq/orders__invoicing/output", "kmq/payments__billing/queue"} <= set(listed["assets"])
    assert {"process_orders__invoicing", "track_payments__billing"} <= set(listed["jobs"])
    assert {"backlog_orders__invoicing", "observe_payments__billing"} <= set(listed["sensors"])
    assert listed["sensors"].count("kmq_run_failures") == 1
