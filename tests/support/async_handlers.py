"""Handlers for `kmq worker` tests: an ``async def`` one that records each message after an
await (``KMQ_TEST_OUTPUT_DIR``), and a generator function the worker must refuse."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

from kmq_dagster.kafka.message import KmqMessage


async def record(message: KmqMessage) -> None:
    await asyncio.sleep(0.001)
    with (Path(os.environ["KMQ_TEST_OUTPUT_DIR"]) / "handled.txt").open("a") as out:
        out.write(f"{(message.value or b'').decode()}\n")


def steps(message: KmqMessage) -> Iterator[str]:
    yield f"never run for {message.offset}"
