"""`kmq dlq list` and `kmq dlq show`: dead letters from the terminal, filtered like a replay."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from kmq_dagster.core.headers import replace_headers
from kmq_dagster.core.retry_headers import Failure, Origin, copy_headers
from kmq_dagster.settings import KmqSettings
from tests.console.test_error_text_masking import SECRET_NAMES, SHAPES
from tests.kafka_helpers import new_queue, produce_dead_letters
from tests.support.kmq_cli import KmqCli

pytestmark = pytest.mark.kafka


def test_list_filters_like_a_replay_and_show_renders_one_in_full(
    settings: KmqSettings, topic_name: str, kmq_cli: KmqCli
) -> None:
    queue = new_queue(settings, topic_name, "g", partitions=2, aux_partitions=2)
    letters = [("a", "TimeoutError"), ("b", "KeyError"), ("c", "TimeoutError"),
               ("d", "TimeoutError")]  # fmt: skip
    produce_dead_letters(settings, queue, letters)
    binary = Producer(settings.producer_config())
    binary.produce(queue.queue.dlq_topic, key=b"bin", value=b"\x00\xff<script>", partition=1)
    assert binary.flush(30) == 0
    base = ["dlq", "list", "-t", topic_name, "-g", "g"]

    # when listing timeouts, two at most, as JSON
    printed = kmq_cli.ok(*base, "--error-type", "TimeoutError", "--limit", "2", "--json")
    listed = [json.loads(line) for line in printed.splitlines()]

    # then the first two timeouts come back with their reason and origin
    assert [row["key"] for row in listed] == ["a", "c"]
    assert listed[0]["reason"] == "failed 2 attempts" and listed[0]["original"].startswith(
        f"{topic_name}[0]@"
    )
    # and the table says that more match
    table = kmq_cli.ok(*base, "--error-type", "TimeoutError", "--limit", "2")
    assert "2 dead letters shown of" in table and "more match (raise --limit above 2)" in table

    # when one is shown, its value is a hex dump if it is not text, never interpreted
    shown = kmq_cli.ok("dlq", "show", "-t", topic_name, "-g", "g", "1:2")
    assert "key              bin" in shown and "value (binary, 10 bytes)" in shown
    assert "00 ff 3c 73 63 72 69 70 74 3e" in shown and "..<script>" in shown

    # and asking for a record that is not there is one error line
    assert kmq_cli.fails("dlq", "show", "-t", topic_name, "-g", "g", "1:99").startswith(
        "kmq: error: "
    )
    assert "has 2 partitions" in kmq_cli.fails("dlq", "show", "-t", topic_name, "-g", "g", "7:0")


def test_show_and_list_mask_secrets_in_the_error_text_of_every_shape(
    settings: KmqSettings, topic_name: str, kmq_cli: KmqCli
) -> None:
    # given dead letters whose error message and traceback hold a secret, and whose value holds
    # another, one shape each (a name of the each, in turn), and a card number
    queue = new_queue(settings, topic_name, "g", partitions=1).queue
    producer = Producer(settings.producer_config())
    shapes = [*SHAPES.items(), ("card", lambda _name, secret: f"card {secret} declined")]
    for index, (shape, make) in enumerate(shapes):
        name = SECRET_NAMES[index % len(SECRET_NAMES)]
        secrets = (f"Zq-Leak{index}-Pw99", f"Zq-Value{index}-Pw99")
        if shape == "card":
            secrets = ("4111 1111 1111 1111", "5500-0000-0000-0004")
        message = f"order rejected: {make(name, secrets[0])}"
        failure = Failure("ValueError", message, f"Traceback ...\nValueError: {message}")
        origin = Origin(topic_name, 0, index, 1_700_000_000_000)
        headers = copy_headers(origin, "g", failure, attempt=1, dlq_reason="a fatal error")
        value = f"order rejected: {make(name, secrets[1])}".encode()
        producer.produce(queue.dlq_topic, value=value, headers=[*replace_headers([], headers)])
    assert producer.flush(30) == 0

    # when each is shown in full, and all are listed as JSON
    printed = "".join(
        kmq_cli.ok("dlq", "show", "-t", topic_name, "-g", "g", f"0:{index}")
        for index in range(len(shapes))
    )
    printed += kmq_cli.ok("dlq", "list", "-t", topic_name, "-g", "g", "--json")

    # then no secret is printed, and the text around them is
    leaked = [shape for index, (shape, _) in enumerate(shapes)
              if f"Leak{index}-" in printed or f"Value{index}-" in printed]  # fmt: skip
    assert leaked == []
    assert "1111 1111" not in printed and "0000-0000" not in printed
    assert printed.count("order rejected") >= 2 * len(shapes)
