"""What a Spark task does with a chunk of records: messages from columns, the function called
until time is up, and the output rows of the successes."""

from __future__ import annotations

import json

from confluent_kafka import Message

from kmq_dagster.core.headers import ORIGINAL_OFFSET, ORIGINAL_PARTITION, ORIGINAL_TOPIC
from kmq_dagster.core.retry_headers import Failure
from kmq_dagster.kafka.record_columns import record_columns
from kmq_dagster.spark.message import SparkMessage, spark_messages
from kmq_dagster.spark.process import FAILED, STEP_S, call_function, output_columns


def records(count: int, topic: str = "orders", headers: bool = False) -> list[Message]:
    return [
        Message(
            topic=topic,
            partition=1,
            offset=100 + i,
            key=f"k{i}".encode(),
            value=str(i).encode(),
            timestamp=(1, 1_700_000_000_000 + i),
            headers=[("h", b"x")] if headers else None,
        )
        for i in range(count)
    ]


def test_messages_from_columns_equal_the_constructed_ones() -> None:
    chunk = records(3, headers=True)

    messages = spark_messages("orders", 1, record_columns(chunk))

    assert messages[2] == SparkMessage(
        "orders", 1, 102, b"k2", b"2", [("h", b"x")], timestamp_ms=1_700_000_000_002
    )
    assert all(type(m) is SparkMessage for m in messages)
    assert spark_messages("orders", 1, record_columns(records(1)))[0].headers == ()


def test_the_function_runs_on_every_message_and_failures_are_kept_with_their_error() -> None:
    messages = spark_messages("orders", 1, record_columns(records(10)))

    def odd_fails(message: SparkMessage) -> int:
        if message.offset % 2:
            raise ValueError(f"odd {message.offset}")
        return message.offset

    outcome = call_function(odd_fails, messages, stop_at=float("inf"))

    assert outcome.done == 10
    assert outcome.results[:3] == [100, FAILED, 102]
    assert [m.offset for m, _ in outcome.failed] == [101, 103, 105, 107, 109]
    failure = outcome.failed[0][1]
    assert isinstance(failure, Failure) and failure.error_type == "ValueError"


def test_a_message_with_unreadable_retry_metadata_fails_without_the_function() -> None:
    messages = spark_messages("orders", 1, record_columns(records(3)))
    called: list[int] = []

    outcome = call_function(
        lambda m: called.append(m.offset),
        messages,
        stop_at=float("inf"),
        check=lambda m: "corrupt retry metadata: x" if m.offset == 101 else None,
    )

    assert called == [100, 102]
    assert outcome.failed == [(messages[1], "corrupt retry metadata: x")]


def test_calls_stop_soon_after_time_is_up_but_never_before_one_message() -> None:
    messages = spark_messages("orders", 1, record_columns(records(200)))
    now = [0.0]  # a clock each call moves 2 ms on: a machine's load cannot change the count

    def slow(_message: SparkMessage) -> None:
        now[0] += 0.002

    outcome = call_function(slow, messages, stop_at=0.05, clock=lambda: now[0])
    # 25 fit in 50 ms; the clock is read between steps, which grow while under STEP_S
    assert 25 <= outcome.done <= 25 + int(STEP_S / 0.002), outcome.done

    late = call_function(slow, messages, stop_at=now[0] - 1, clock=lambda: now[0])
    assert late.done == 1


def test_output_rows_are_the_successes_with_their_json_results() -> None:
    chunk = records(4)
    columns = record_columns(chunk)
    messages = spark_messages("orders", 1, columns)
    outcome = call_function(
        lambda m: None if m.offset == 100 else {"n": m.offset} if m.offset != 102 else 1 / 0,
        messages,
        stop_at=float("inf"),
    )

    topics, partitions, offsets, keys, results, batch_ids = (
        list(c) for c in output_columns(messages, outcome, columns, "b1")
    )

    assert offsets == [100, 101, 103]
    assert keys == [b"k0", b"k1", b"k3"]
    assert results == ["null", json.dumps({"n": 101}), json.dumps({"n": 103})]
    assert topics == ["orders"] * 3 and partitions == [1] * 3 and batch_ids == ["b1"] * 3


def test_output_rows_of_retried_copies_carry_where_the_message_was_first_produced() -> None:
    chunk = [
        Message(
            topic="orders.g.retry.1s",
            partition=0,
            offset=7,
            value=b"v",
            headers=[
                (ORIGINAL_TOPIC, b"orders"),
                (ORIGINAL_PARTITION, b"3"),
                (ORIGINAL_OFFSET, b"41"),
            ],
        )
    ]
    columns = record_columns(chunk)
    messages = spark_messages("orders.g.retry.1s", 0, columns)
    outcome = call_function(lambda m: "ok", messages, stop_at=float("inf"))

    topics, partitions, offsets, *_ = (
        list(c) for c in output_columns(messages, outcome, columns, "b1")
    )

    assert (topics, partitions, offsets) == (["orders"], [3], [41])
