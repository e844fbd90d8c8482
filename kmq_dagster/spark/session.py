"""A Spark session for running kmq; on a cluster, build your own or pass the master."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession

LOCAL_MASTER = "local[2]"
#: Log4j 2 settings that let only errors of the JVM through (shipped with the package).
QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")


def local_session(
    app_name: str = "kmq",
    master: str = LOCAL_MASTER,
    *,
    quiet: bool = True,
    jvm_log: Path | None = None,
) -> SparkSession:
    """A session on ``master``: no web UI or progress bar, few shuffle partitions.

    With a ``local`` master everything stays on loopback and the Python workers run this very
    interpreter. With a cluster's master (``spark://host:7077``, ...) addresses, the
    executors' Python and any other settings come from Spark's own configuration
    (``spark-defaults.conf`` in ``SPARK_CONF_DIR``, or ``PYSPARK_PYTHON``).

    Args:
        quiet: keep Spark's INFO/WARN logs off the console (errors still show); ``kmq ... -v``
            turns it off.
        jvm_log: where the JVM's own console output goes (its start-up notices included)
            instead of this process's stdout and stderr.
    """
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        # kmq prints a line per batch; Spark's progress bar would overwrite it.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
    )
    if master.startswith("local"):
        # Python workers connect back to the JVM; on hosts with several addresses pick loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Executors run this same interpreter, so they import kmq and confluent-kafka from here.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.config("spark.driver.host", "127.0.0.1")
    if quiet:
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={QUIET_LOG4J}"
        )
    with _console_to(jvm_log):
        session = builder.getOrCreate()
    if quiet:
        session.sparkContext.setLogLevel("ERROR")
    return session


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
