"""KmqQueueComponent loaded from a defs.yaml the way a dg project loads it (Dagster's own
component sandbox): the same definitions as the Python path, secrets kept as EnvVar, Dagster's
validation errors naming the field, and the output's freshness policy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from dagster import AssetKey, Definitions, FreshnessPolicy, build_resources
from dagster.components.testing import create_defs_folder_sandbox

from kmq_dagster import BreakerConfig, KmqQueueComponent, Queue, RetryPolicy
from kmq_dagster.core.value_formats import ValueFormat
from kmq_dagster.defs import QueueSpec, kmq_definitions
from kmq_dagster.demo.orders import price_order
from kmq_dagster.errors import ConfigError

COMPONENT = "kmq_dagster.KmqQueueComponent"

ORDERS: dict[str, Any] = {
    "topic": "orders",
    "group": "pricing",
    "partitions": 2,
    "aux_partitions": 1,
    "retry": {"delays": ["1s", "3s"], "non_retryable": ["KeyError"]},
    "visibility_timeout": "45s",
    "max_redeliveries": 5,
    "value_format": "avro",
    "key_format": "json",
    "function": "kmq_dagster.demo.orders.price_order",
    "output_path": "/data/orders_priced.parquet",
    "backlog_interval_s": 5,
    "breaker": {"window": "1m", "min_calls": 10, "cooldown": "20s"},
    "processing_cron": "*/15 * * * *",
    "dead_letter_window": "5m",
}

#: What ORDERS declares, written in Python.
ORDERS_SPEC = QueueSpec(
    Queue(
        "orders",
        "pricing",
        partitions=2,
        aux_partitions=1,
        retry_policy=RetryPolicy.fixed([1_000, 3_000], non_retryable=["KeyError"]),
        visibility_timeout_ms=45_000,
        max_redeliveries=5,
        value_format=ValueFormat.AVRO,
        key_format=ValueFormat.JSON,
    ),
    function=price_order,
    output_path="/data/orders_priced.parquet",
    backlog_interval_s=5,
    breaker=BreakerConfig(window_ms=60_000, min_calls=10, cooldown_ms=20_000),
    processing_cron="*/15 * * * *",
    dead_letter_window_ms=300_000,
)


@contextmanager
def loaded(attributes: dict[str, Any]) -> Iterator[tuple[Any, Definitions]]:
    """The component and its definitions from a defs.yaml with these attributes."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=KmqQueueComponent,
            defs_path="orders",
            defs_yaml_contents={"type": COMPONENT, "attributes": attributes},
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            yield component, defs


def names(defs: Definitions) -> dict[str, list[str]]:
    repository = defs.get_repository_def()
    return {
        "assets": sorted(k.to_user_string() for k in repository.asset_graph.get_all_asset_keys()),
        "checks": sorted(str(key) for key in repository.asset_graph.asset_check_keys),
        "jobs": sorted(j.name for j in repository.get_all_jobs() if not j.name.startswith("__")),
        "sensors": sorted(sensor.name for sensor in repository.sensor_defs),
        "schedules": sorted(schedule.name for schedule in repository.schedule_defs),
    }


def test_the_yaml_declares_what_the_python_spec_declares() -> None:
    with loaded({"queues": [ORDERS]}) as (component, defs):
        (spec,) = [queue.spec() for queue in component.queues]

        assert spec == ORDERS_SPEC
        assert names(defs) == names(kmq_definitions([ORDERS_SPEC]))
        assert "process_on_schedule_orders__pricing" in names(defs)["schedules"]


def test_a_queue_left_at_its_defaults_is_the_python_default() -> None:
    with loaded({"queues": [{"topic": "orders", "group": "g"}]}) as (component, _):
        assert component.queues[0].spec() == QueueSpec(Queue("orders", "g"))


def test_breaker_false_leaves_out_the_breaker_sensor() -> None:
    with loaded({"queues": [{**ORDERS, "breaker": False}]}) as (component, defs):
        assert component.queues[0].spec().breaker is None
        assert "breaker_orders__pricing" not in names(defs)["sensors"]


def test_an_env_template_becomes_an_env_var_the_ui_shows_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", "planted-Secret-4711")
    monkeypatch.setenv("KAFKA_HOST", "kafka.example.com:9092")
    attributes = {
        "queues": [ORDERS],
        "resources": {
            "kafka": {
                "bootstrap_servers": "{{ env.KAFKA_HOST }}",
                "client_config": {
                    "sasl.password": "{{ env.KAFKA_PASSWORD }}",
                    "client.id": "{{ env('KMQ_CLIENT_ID', 'orders-app') }}",
                },
            },
            "alerts": {"slack_token": "{{ env.SLACK_TOKEN }}", "slack_channel": "#queues"},
        },
    }
    with loaded(attributes) as (_, defs):
        resources = defs.resources or {}
        kafka = resources["kmq"].get_resource_definition().config_schema.default_value
        alerts = resources["alerts"].get_resource_definition().config_schema.default_value

        # the values Dagster stores and shows: names of variables, never the secret
        assert kafka["bootstrap_servers"] == {"env": "KAFKA_HOST"}
        assert kafka["client_config"]["sasl.password"] == {"env": "KAFKA_PASSWORD"}
        assert kafka["client_config"]["client.id"] == "orders-app"  # resolved when loading
        assert alerts["slack_token"] == {"env": "SLACK_TOKEN"}
        assert "planted-Secret-4711" not in json.dumps([kafka, alerts])
        # and what a run gets: the variable's value
        with build_resources({"kmq": resources["kmq"]}) as initialized:
            settings = initialized.kmq.get_settings()
        assert settings.bootstrap_servers == "kafka.example.com:9092"
        assert settings.client_config["sasl.password"] == "planted-Secret-4711"


@pytest.mark.parametrize(
    ("queue", "named"),
    [
        ({**ORDERS, "partitions": "two"}, ["partitions"]),
        ({**ORDERS, "visibilty_timeout": "30s"}, ["visibilty_timeout"]),
        ({**ORDERS, "partitions": 0}, [".partitions.", "0 is not in [1, 1000]"]),
        (
            {**ORDERS, "breaker": {"window": "8d"}},
            [".breaker.", ".window ", "'8d' is outside 1ms to 7d"],
        ),
    ],
    ids=["wrong type", "unknown field", "out of bounds", "out of bounds in a group"],
)
def test_invalid_yaml_gets_dagsters_error_naming_the_field(
    queue: dict[str, Any], named: list[str]
) -> None:
    with pytest.raises(Exception) as raised, loaded({"queues": [queue]}):
        pass

    message = causes(raised.value)
    assert "defs.yaml" in message, message  # the file and the path to the field
    assert "queues" in message, message
    assert all(words in message for words in named), message


def test_bounded_fields_take_templates_and_check_what_they_resolve_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    templated = {
        **ORDERS,
        "partitions": "{{ env('KMQ_TEST_PARTITIONS', '3') }}",
        "visibility_timeout": "{{ env('KMQ_TEST_VISIBILITY', '45s') }}",
        "freshness_minutes": "{{ env('KMQ_TEST_FRESHNESS', 'auto') }}",
    }
    with loaded({"queues": [templated]}) as (component, _):
        spec = component.queues[0].spec()
        assert (spec.queue.partitions, spec.queue.visibility_timeout_ms) == (3, 45_000)

    monkeypatch.setenv("KMQ_TEST_VISIBILITY", "8d")
    with pytest.raises(Exception) as raised, loaded({"queues": [templated]}):
        pass
    assert "'8d' is outside 1ms to 7d" in causes(raised.value)


def causes(error: BaseException | None) -> str:
    """The error and what caused it, as ``dg check defs`` prints them."""
    lines = []
    while error is not None:
        lines.append(str(error))
        error = error.__cause__
    return "\n".join(lines)


def test_an_unimportable_function_is_a_config_error_naming_queue_and_field() -> None:
    queue = {**ORDERS, "function": "no_such_module.f"}
    with pytest.raises(Exception) as raised, loaded({"queues": [queue]}):
        pass

    assert isinstance(raised.value.__cause__, ConfigError)
    assert "queue orders / pricing: function: cannot import 'no_such_module.f'" in causes(
        raised.value
    )


def test_concurrency_and_ordering_reach_the_spec() -> None:
    queue = {**ORDERS, "concurrency": 8, "ordering": "key"}
    with loaded({"queues": [queue]}) as (component, _):
        spec = component.queues[0].spec()
        assert (spec.concurrency, str(spec.ordering)) == (8, "key")


def output_policy(defs: Definitions) -> FreshnessPolicy | None:
    key = AssetKey(["kmq", "orders__pricing", "output"])
    return defs.resolve_assets_def(key).specs_by_key[key].freshness_policy


def test_freshness_minutes_puts_a_time_window_policy_on_the_output() -> None:
    with loaded({"queues": [{**ORDERS, "freshness_minutes": 7}]}) as (_, defs):
        assert output_policy(defs) == FreshnessPolicy.time_window(fail_window=timedelta(minutes=7))
    with loaded({"queues": [ORDERS]}) as (_, defs):
        assert output_policy(defs) is None


def test_auto_freshness_is_one_backlog_interval_and_one_run_long() -> None:
    queue = {**ORDERS, "freshness_minutes": "auto", "backlog_interval_s": 30}
    queue["max_run_seconds"] = 600
    with loaded({"queues": [queue]}) as (_, defs):
        assert output_policy(defs) == FreshnessPolicy.time_window(
            fail_window=timedelta(minutes=11)  # 30 s + 600 s, in whole minutes up
        )
