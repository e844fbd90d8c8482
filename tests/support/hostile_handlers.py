"""Handlers for `kmq worker` tests that raise what a worker could choke on: an exception whose
``str()`` raises, and ``GeneratorExit`` (a ``BaseException`` that is no exit request). Every
other message is recorded in ``$KMQ_TEST_OUTPUT_DIR/handled.txt``."""

from __future__ import annotations

import os
from pathlib import Path

from kmq_dagster.kafka.message import KmqMessage


class Unprintable(ValueError):
    def __str__(self) -> str:
        raise RuntimeError("cannot render")


def handle(message: KmqMessage) -> None:
    if message.value == b"unprintable":
        raise Unprintable()
    if message.value == b"generator-exit":
        raise GeneratorExit("closed")
    with (Path(os.environ["KMQ_TEST_OUTPUT_DIR"]) / "handled.txt").open("a") as out:
        out.write(f"{(message.value or b'').decode()}\n")
