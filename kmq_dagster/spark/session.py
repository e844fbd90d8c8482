"""The Spark session ``kmq spark`` and ``kmq demo`` run on: local, or a cluster's master."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

LOCAL_MASTER = "local[2]"


def local_session(app_name: str = "kmq", master: str = LOCAL_MASTER) -> SparkSession:
    """A session on ``master``: no web UI or progress bar, few shuffle partitions.

    With a ``local`` master everything stays on loopback and the Python workers run this very
    interpreter. With a cluster's master (``spark://host:7077``, ...) addresses, the
    executors' Python and any other settings come from Spark's own configuration
    (``spark-defaults.conf`` in ``SPARK_CONF_DIR``, or ``PYSPARK_PYTHON``).
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
    return builder.getOrCreate()
