"""A Spark driver that SIGKILLs itself (and its process group: JVM, Python workers) right after
a batch's output is committed to the sink, before a single acknowledgement is written:
``python -m tests.support.spark_killed_after_write TOPIC GROUP OUTPUT`` (Kafka from ``KMQ_*``).

The kill is placed by wrapping the job's output commit, so the product has no test hook in it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from kmq_dagster import KmqSettings, SparkQueueJob, open_queue
from kmq_dagster.spark.session import local_session
from tests.support.spark_functions import slow_echo


def main(topic: str, group: str, output: str) -> None:
    settings = KmqSettings.from_env()
    spark = local_session("kmq-killed-after-write")
    job = SparkQueueJob(
        spark, open_queue(settings, topic, group), function=slow_echo,
        output_path=output, max_messages_per_partition=200,
    )  # fmt: skip
    job.warm_up()  # Python workers started: the batch's time goes to reading and processing
    commit_output = job._commit_output

    def commit_then_die(*args: Any) -> None:
        commit_output(*args)
        print("output committed; killing the driver before its acknowledgements", flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    job._commit_output = commit_then_die  # type: ignore[method-assign,assignment]
    job.run_batch()
    raise SystemExit("the batch returned: the kill point was never reached")


if __name__ == "__main__":
    main(*sys.argv[1:4])
