"""`kmq worker` and `kmq tracker`: bad arguments and missing topics are one-line errors."""

from __future__ import annotations

import pytest

from kmq_dagster.settings import KmqSettings
from tests.processes import run_kmq

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("no_colon", "--handler takes package.module:function"),
        ("no.such.module:f", "cannot import handler module 'no.such.module'"),
        ("json:no_such_function", "json has no callable 'no_such_function'"),
    ],
)
def test_bad_handler_is_a_one_line_error(settings: KmqSettings, handler: str, message: str) -> None:
    result = run_kmq(
        "worker", "-t", "x", "-g", "g", "--handler", handler,
        env={"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers},
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith(f"kmq: error: {message}")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["worker", "tracker"])
def test_unprovisioned_queue_is_a_one_line_error(
    settings: KmqSettings, topic_name: str, command: str
) -> None:
    extra = ["--handler", "json:dumps"] if command == "worker" else []
    result = run_kmq(
        command, "-t", topic_name, "-g", "g", *extra,
        env={"KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers},
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"run `kmq provision --topic {topic_name} --group g` first" in result.stderr
