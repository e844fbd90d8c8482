"""The Schema Registry basics: formats by name, the wire format's header, the registry's
settings from the environment (secrets masked), and which registry failures are the message's
fault (dead-letter it) and which are the registry's (retry it)."""

from __future__ import annotations

import pytest

from kmq_dagster.errors import ConfigError
from kmq_dagster.schemas import (
    RegistrySettings,
    RegistryUnavailable,
    UndecodableValue,
    ValueFormat,
    framed_schema_id,
    parse_value_format,
    registry_client,
)
from kmq_dagster.schemas.registry import registry_failure
from kmq_dagster.secrets import mask_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [("avro", ValueFormat.AVRO), ("JSON_SCHEMA", ValueFormat.JSON_SCHEMA),
     (" protobuf ", ValueFormat.PROTOBUF), ("bytes", ValueFormat.BYTES)],
)  # fmt: skip
def test_formats_are_named_as_users_write_them(text: str, expected: ValueFormat) -> None:
    assert parse_value_format(text) is expected


def test_an_unknown_format_names_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match="unknown value format 'xml': use one of bytes, json, "):
        parse_value_format("xml")


def test_only_the_registry_formats_need_a_registry() -> None:
    assert {f for f in ValueFormat if f.uses_registry} == {
        ValueFormat.AVRO, ValueFormat.PROTOBUF, ValueFormat.JSON_SCHEMA
    }  # fmt: skip


def test_the_schema_id_is_read_from_the_five_byte_header() -> None:
    assert framed_schema_id(b"\x00\x00\x01\x00\x07payload") == 65_543


@pytest.mark.parametrize(
    ("raw", "reason"),
    [(b"", "no value"), (None, "no value"), (b'{"id": 1}', "first byte 0x7b, expected 0x00"),
     (b"\x00\x00\x01", "too short .* 3 bytes")],
)  # fmt: skip
def test_a_value_without_the_header_is_undecodable_with_its_reason(
    raw: bytes | None, reason: str
) -> None:
    with pytest.raises(UndecodableValue, match=reason):
        framed_schema_id(raw)


def test_settings_come_from_the_environment_and_hide_the_password() -> None:
    settings = RegistrySettings.from_env({
        "KMQ_SCHEMA_REGISTRY_URL": "https://registry:8081",
        "KMQ_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": "bob:RegistryPw-77",
        "KMQ_SCHEMA_REGISTRY_SSL_CA_LOCATION": "/etc/ca.pem",
    })  # fmt: skip
    assert settings.client_config() == {
        "url": "https://registry:8081",
        "basic.auth.user.info": "bob:RegistryPw-77",
        "ssl.ca.location": "/etc/ca.pem",
    }
    assert "RegistryPw-77" not in repr(settings)
    assert "RegistryPw-77" not in mask_text("login failed for bob:RegistryPw-77")


def test_no_url_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="set KMQ_SCHEMA_REGISTRY_URL"):
        registry_client(RegistrySettings.from_env({}))


def test_one_client_per_settings_so_a_process_shares_its_schemas() -> None:
    settings = RegistrySettings(url="mock://schema-core-test")
    assert registry_client(settings) is registry_client(
        RegistrySettings(url="mock://schema-core-test")
    )
    assert registry_client(settings) is not registry_client(RegistrySettings(url="mock://other"))


def test_an_unknown_schema_id_is_the_messages_fault() -> None:
    client = registry_client(RegistrySettings(url="mock://schema-core-unknown"))
    with pytest.raises(Exception) as raised:
        client.get_schema(4_242)
    assert isinstance(registry_failure(raised.value), UndecodableValue)


def test_a_registry_that_does_not_answer_is_retryable() -> None:
    client = registry_client(RegistrySettings(url="http://127.0.0.1:9", config={"timeout": "2"}))
    with pytest.raises(Exception) as raised:
        client.get_schema(1)
    failure = registry_failure(raised.value)
    assert isinstance(failure, RegistryUnavailable)
    assert "did not answer" in str(failure)


def test_a_bare_404_from_a_wrong_url_path_is_not_the_messages_fault() -> None:
    class WrongPath(Exception):
        http_status_code = 404
        error_code = -1

    assert isinstance(registry_failure(WrongPath("Not Found")), RegistryUnavailable)


def test_numeric_settings_reach_the_client_as_numbers() -> None:
    settings = RegistrySettings.from_env({
        "KMQ_SCHEMA_REGISTRY_URL": "mock://schema-core-numbers",
        "KMQ_SCHEMA_REGISTRY_MAX_RETRIES": "0",
        "KMQ_SCHEMA_REGISTRY_TIMEOUT": "3",
    })  # fmt: skip
    assert settings.client_config()["max.retries"] == 0
    registry_client(RegistrySettings(url="http://127.0.0.1:9", config=settings.config))
