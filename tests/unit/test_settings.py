"""Settings come from KMQ_* variables, then flags; bad values are clear errors."""

from __future__ import annotations

import pytest

from kmq_dagster.errors import ConfigError
from kmq_dagster.settings import (
    DEFAULT_BOOTSTRAP_SERVERS,
    KmqSettings,
    parse_client_options,
    parse_delay_list,
)


def test_defaults_point_at_the_embedded_broker() -> None:
    settings = KmqSettings.from_env({})
    assert settings.bootstrap_servers == DEFAULT_BOOTSTRAP_SERVERS == "127.0.0.1:9092"
    assert settings.visibility_timeout_ms == 30_000
    assert settings.max_redeliveries == 3


def test_environment_is_read_and_flags_override_it() -> None:
    env = {
        "KMQ_BOOTSTRAP_SERVERS": "kafka-1:9092,kafka-2:9092",
        "KMQ_SESSION_TIMEOUT_MS": "45000",
        "KMQ_FETCH_WAIT_MAX_MS": "200",
        "KMQ_VISIBILITY_TIMEOUT": "2m",
        "KMQ_RETRY_DELAYS": "5m,5m,30m",
        "KMQ_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KMQ_KAFKA_SASL_MECHANISM": "PLAIN",
    }
    settings = KmqSettings.from_env(
        env, bootstrap_servers="flag:9092", client_config={"sasl.username": "u"}, batch_size=None
    )
    assert settings.bootstrap_servers == "flag:9092"
    assert settings.session_timeout_ms == 45_000
    assert settings.visibility_timeout_ms == 120_000
    assert settings.retry_delays_ms == (300_000, 300_000, 1_800_000)
    assert settings.batch_size == 500  # a None flag falls through to the default
    consumer = settings.consumer_config("g")
    assert consumer["security.protocol"] == "SASL_SSL"
    assert consumer["sasl.mechanism"] == "PLAIN"
    assert consumer["sasl.username"] == "u"
    assert consumer["enable.auto.commit"] is False
    assert consumer["session.timeout.ms"] == 45_000
    assert consumer["fetch.wait.max.ms"] == 200


def test_a_queue_being_defined_takes_the_environment_for_what_is_not_given() -> None:
    # given KMQ_* defaults for a queue's definition
    env = {"KMQ_VISIBILITY_TIMEOUT": "2m", "KMQ_MAX_REDELIVERIES": "7", "KMQ_RETRY_DELAYS": "5s"}
    settings = KmqSettings.from_env(env)

    # when queues are defined with nothing, and with everything, given
    defaulted = settings.define_queue("orders", "billing")
    given = settings.define_queue(
        "orders", "billing", partitions=4, retry_policy=settings.retry_policy(backoff="1s,2,8s"),
        visibility_timeout_ms=1_000, max_redeliveries=0,
    )  # fmt: skip

    # then the environment fills the gaps, and given values (0 included) win
    assert (defaulted.visibility_timeout_ms, defaulted.max_redeliveries) == (120_000, 7)
    assert defaulted.retry_policy.delays_ms == (5_000,)
    assert (given.partitions, given.visibility_timeout_ms, given.max_redeliveries) == (4, 1_000, 0)
    assert given.retry_policy.topic_delays_ms() == [1_000, 2_000, 4_000, 8_000]


def test_client_passthrough_tunes_defaults_but_cannot_turn_on_auto_commit() -> None:
    env = {"KMQ_KAFKA_FETCH_QUEUE_BACKOFF_MS": "100", "KMQ_KAFKA_ENABLE_AUTO_COMMIT": "true"}
    consumer = KmqSettings.from_env(env).consumer_config("g")
    assert consumer["fetch.queue.backoff.ms"] == "100"
    assert consumer["enable.auto.commit"] is False


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KMQ_SESSION_TIMEOUT_MS": "ten"}, "KMQ_SESSION_TIMEOUT_MS must be an integer"),
        ({"KMQ_VISIBILITY_TIMEOUT": "soon"}, "not a duration"),
        ({"KMQ_BATCH_SIZE": "0"}, "batch_size must be between 1 and 1,000,000"),
        ({"KMQ_FETCH_WAIT_MAX_MS": "0"}, "fetch_wait_max_ms must be positive"),
        ({"KMQ_RETRY_DELAYS": ","}, "retry delays"),
        ({"KMQ_BOOTSTRAP_SERVERS": " "}, "bootstrap servers must not be empty"),
    ],
)
def test_bad_values_are_config_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KmqSettings.from_env(env)


def test_client_options_need_key_and_value() -> None:
    assert parse_client_options(["a.b=1", "c= x=y"]) == {"a.b": "1", "c": " x=y"}
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_client_options(["novalue"])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("sasl.password:Hunter22", "write sasl.password=..., not sasl.password:..."),
        ("=Hunter22", "no name before its '='"),
        ("Hunter22", "not shown: it may be a secret"),
    ],
)
def test_malformed_client_options_are_refused_without_echoing_their_text(
    option: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        parse_client_options([option])

    assert "Hunter22" not in str(raised.value)


@pytest.mark.parametrize("servers", ["", " ", "a:1,,b:2", "a:1,", "kmq:Hunter22@broker:9092"])
def test_bootstrap_lists_that_kafka_cannot_use_are_refused(servers: str) -> None:
    with pytest.raises(ConfigError) as raised:
        KmqSettings(bootstrap_servers=servers)

    assert raised.value.setting == "bootstrap_servers"
    assert "Hunter22" not in str(raised.value)


@pytest.mark.parametrize("delays", ["1s,,2s", "1s,", ",1s", "1s, ,2s"])
def test_a_delay_list_with_an_empty_entry_is_refused(delays: str) -> None:
    with pytest.raises(ConfigError, match="comma-separated list"):
        parse_delay_list(delays)


def test_delay_list() -> None:
    assert parse_delay_list("10s, 1m,1h30m") == (10_000, 60_000, 5_400_000)
