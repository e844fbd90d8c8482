"""Oversize messages (issue 34, item 2): the reference headers a dead letter carries, and the
client limits kmq sets, derived from the user's settings."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer

from kmq_dagster.core.headers import DLQ_REASON, header_value, replace_headers
from kmq_dagster.core.oversize import (
    OVERSIZE_BYTES,
    VALUE_REF,
    Reference,
    ValueRef,
    oversize_reason,
    record_size,
    reference_of,
    reference_updates,
)
from kmq_dagster.settings import PRODUCER_MESSAGE_MAX_BYTES, KmqSettings

ONE_MB = 1024 * 1024


def test_a_reference_reads_back_as_the_coordinates_and_size_it_was_written_with() -> None:
    # given the record at orders.v2_eu-1[3]@1234567 (a topic name with every legal kind of
    # character), refused for its size
    ref = ValueRef("orders.v2_eu-1", 3, 1_234_567)
    reason = oversize_reason(2_000_000, "orders.v2_eu-1.g.retry.1m", "Message size too large", ref)
    headers = replace_headers([("trace", b"t")], reference_updates(ref, 2_000_000, reason))
    # then the headers name it, its size and why, and read back the same
    assert header_value(headers, VALUE_REF) == b"orders.v2_eu-1/3/1234567"
    assert reference_of(headers) == Reference(ref, 2_000_000)
    assert header_value(headers, DLQ_REASON) == (
        b"too large to copy: a record of 2,000,000 bytes was refused for "
        b"orders.v2_eu-1.g.retry.1m (Message size too large); dead-lettered as a reference to "
        b"orders.v2_eu-1 [3] @ 1234567"
    )


def test_an_ordinary_dead_letter_is_no_reference_and_a_bad_reference_is_an_error() -> None:
    assert reference_of([("trace", b"t")]) is None
    for bad in (b"orders/x/1", b"orders/1", b"/0/1", b"\xff/0/1"):
        with pytest.raises(ValueError, match=VALUE_REF):
            reference_of([(VALUE_REF, bad), (OVERSIZE_BYTES, b"1")])


def test_a_record_weighs_its_key_value_and_headers() -> None:
    assert record_size(b"k", b"vvv", [("h", b"xx"), ("n", None)]) == 1 + 3 + 3 + 1
    assert record_size(None, None, None) == 0


def test_the_producers_limit_is_the_users_message_max_bytes_lower_or_higher() -> None:
    assert KmqSettings().producer_config()["message.max.bytes"] == PRODUCER_MESSAGE_MAX_BYTES
    for asked in (1_000_000, 30_000_000):
        given = KmqSettings(client_config={"message.max.bytes": str(asked)})
        assert given.producer_config()["message.max.bytes"] == asked


def test_kmq_fetch_bounds_give_way_to_the_users_settings() -> None:
    bounds = {"fetch_max_bytes": ONE_MB, "queued_max_messages_kbytes": 4_096}
    # unset: kmq's bounds
    assert KmqSettings().fetch_limits(**bounds) == {
        "fetch.max.bytes": ONE_MB, "queued.max.messages.kbytes": 4_096}  # fmt: skip
    # a larger message.max.bytes raises fetch.max.bytes with it (librdkafka refuses less)
    raised = KmqSettings(client_config={"message.max.bytes": "30000000"})
    assert raised.fetch_limits(**bounds)["fetch.max.bytes"] == 30_000_000
    # a bound the user sets is theirs: kmq leaves it out
    own = KmqSettings(client_config={"fetch.max.bytes": "5000000"})
    assert own.fetch_limits(**bounds) == {"queued.max.messages.kbytes": 4_096}


def test_a_consumer_with_kmq_bounds_and_a_30_mb_message_max_bytes_is_accepted() -> None:
    # librdkafka checks its settings when the client is made: no broker is needed
    settings = KmqSettings(client_config={"message.max.bytes": "30000000"})
    config = settings.consumer_config("g", **settings.fetch_limits(fetch_max_bytes=ONE_MB))
    Consumer(config).close()
