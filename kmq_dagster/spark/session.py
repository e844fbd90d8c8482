"""A Spark session for running kmq locally; on a cluster, build your own and pass it in."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

LOCAL_MASTER = "local[2]"


def local_session(app_name: str = "kmq", master: str = LOCAL_MASTER) -> SparkSession:
    """A session on this machine: loopback only, no web UI or progress bar, few shuffle
    partitions."""
    # Python workers connect back to the JVM; on hosts with several addresses pick loopback.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors run this same interpreter, so they import kmq and confluent-kafka from here.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        # kmq prints a line per batch; Spark's progress bar would overwrite it.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
