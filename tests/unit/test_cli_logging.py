"""What the ``kmq`` command's logging lets through to stderr: kmq's own INFO lines, but not
py4j's INFO, not even what py4j logs through the root logger (a traceback when Spark's JVM is
gone, which the command-line fuzz test once caught in a ``kmq send``'s error output)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kmq_dagster.cli.app import configure_logging

PY4J_GATEWAY = str(Path("site-packages") / "py4j" / "java_gateway.py")


@pytest.fixture(autouse=True)
def restore_root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def py4j_root_record(level: int) -> logging.LogRecord:
    """A record as py4j's ``logging.info("Exception while sending command.", exc_info=True)``
    makes it."""
    try:
        raise ConnectionResetError("the JVM is gone")
    except ConnectionResetError:
        exc_info = sys.exc_info()
    return logging.LogRecord(
        "root", level, PY4J_GATEWAY, 1056, "Exception while sending command.", None, exc_info
    )


def test_py4j_info_through_the_root_logger_stays_off_stderr_and_kmq_info_shows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    configure_logging(log_file=tmp_path / "kmq.log")
    logging.getLogger().handle(py4j_root_record(logging.INFO))
    kmq_log = logging.getLogger("kmq_dagster.cli-logging-test")
    kmq_log.setLevel(logging.INFO)  # whatever other tests in this process set on its parents
    kmq_log.info("worker started")

    err = capsys.readouterr().err
    assert "worker started" in err
    assert "Exception while sending command" not in err
    assert "Traceback" not in err
    assert "Exception while sending command" not in (tmp_path / "kmq.log").read_text()


def test_py4j_warnings_and_verbose_runs_still_show_it(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging()
    logging.getLogger().handle(py4j_root_record(logging.WARNING))
    assert "Exception while sending command" in capsys.readouterr().err

    configure_logging(verbose=True)
    logging.getLogger().handle(py4j_root_record(logging.INFO))
    assert "Exception while sending command" in capsys.readouterr().err
