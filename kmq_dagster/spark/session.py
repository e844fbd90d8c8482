"""Starting Spark for kmq: one factory for every front end; on a cluster, pass the master and
your settings."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

LOCAL_MASTER = "local[2]"
#: Log4j 2 settings that let only errors of the JVM through (shipped with the package).
QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")


def session_config(
    app_name: str = "kmq", master: str = LOCAL_MASTER, *, quiet: bool = True
) -> dict[str, str]:
    """Spark settings for kmq on ``master``: no web UI or progress bar, few shuffle partitions;
    with a ``local`` master everything stays on loopback. Pass them to :func:`start_session`
    (or to dagster-pyspark's ``spark_config``, through :class:`~kmq_dagster.defs.resources.
    KmqSparkResource`).

    Args:
        quiet: keep Spark's INFO/WARN logs off the console (errors still show).
    """
    config = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        # kmq prints a line per batch; Spark's progress bar would overwrite it.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
    }
    if master.startswith("local"):
        # Python workers connect back to the JVM; on hosts with several addresses pick loopback.
        config["spark.driver.host"] = "127.0.0.1"
        config["spark.driver.bindAddress"] = "127.0.0.1"
    if quiet:
        config["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={QUIET_LOG4J}"
    return config


def start_session(
    config: Mapping[str, Any], *, quiet: bool = True, jvm_log: Path | None = None
) -> SparkSession:
    """The one way kmq starts Spark: ``kmq spark``, ``kmq demo``, the benchmarks and the
    Dagster resource all come here.

    With a ``local`` master the Python workers run the interpreter kmq runs in, so that they
    import kmq and confluent-kafka from where this process does, also from a virtualenv that
    is not activated: PySpark starts them with ``$PYSPARK_PYTHON``, else ``python3`` from
    ``PATH`` (it does not read ``spark.pyspark.python``), so that is set here unless the
    config's ``spark.pyspark.python`` or the environment names another. With a cluster's
    master (``spark://host:7077``, ...) the executors' Python and everything else come from
    ``config`` and Spark's own configuration (``spark-defaults.conf``, ``PYSPARK_PYTHON``).

    Args:
        quiet: only errors of Spark's logs reach the console.
        jvm_log: where the JVM's own console output goes (its start-up notices included)
            instead of this process's stdout and stderr.
    """
    settings = {key: str(value) for key, value in config.items()}
    if settings.get("spark.master", LOCAL_MASTER).startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        python = settings.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
        os.environ["PYSPARK_PYTHON"] = python or sys.executable
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    with _console_to(jvm_log):
        session = builder.getOrCreate()
    if quiet:
        session.sparkContext.setLogLevel("ERROR")
    return session


def local_session(
    app_name: str = "kmq",
    master: str = LOCAL_MASTER,
    *,
    quiet: bool = True,
    jvm_log: Path | None = None,
) -> SparkSession:
    """:func:`start_session` with :func:`session_config` (``kmq ... -v`` sets ``quiet=False``)."""
    return start_session(
        session_config(app_name, master, quiet=quiet), quiet=quiet, jvm_log=jvm_log
    )


@contextlib.contextmanager
def _console_to(log: Path | None) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``log`` while the JVM starts: it inherits them and
    keeps writing there; this process gets its own console back afterwards."""
    if log is None:
        yield
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("ab") as target:
        os.dup2(target.fileno(), 1)
        os.dup2(target.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
