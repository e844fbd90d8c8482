"""A processing run of a declared queue in a process of its own, as Dagster's run launcher
starts one: ``python -m tests.dagster.processing_process TOPIC OUTPUT MAX_PER_PARTITION``
(Kafka and the audit store from ``KMQ_*``). Prints the materialization's batch leases as JSON.
"""

from __future__ import annotations

import json
import sys

from dagster import DagsterInstance

from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.defs import QueueSpec, kmq_definitions
from tests.dagster.helpers import group_for
from tests.support.spark_functions import slow_price


def main(topic: str, output: str, max_per_partition: int) -> None:
    queue = Queue(topic, group_for(topic), partitions=2, retry_policy=RetryPolicy.fixed((1_000,)))
    spec = QueueSpec(queue, function=slow_price, output_path=output)
    job = kmq_definitions([spec]).resolve_job_def(spec.job_name("process"))
    config = {"max_messages_per_partition": max_per_partition}
    result = job.execute_in_process(
        instance=DagsterInstance.ephemeral(),
        run_config={"ops": {spec.output_asset_key.to_python_identifier(): {"config": config}}},
    )
    (event,) = result.get_asset_materialization_events()
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    print(json.dumps({k: metadata[k] for k in ("read", "stopped", "batches", "batch_leases")}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
