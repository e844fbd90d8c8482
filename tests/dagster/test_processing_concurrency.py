"""The processing asset passes a queue's concurrency and ordering to its Spark job, and shows
them in its definition and in each run's materialization (real broker, local Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import DagsterInstance
from dagster_pyspark import PySparkResource

from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.demo.orders import is_flaky, is_poison
from tests.dagster.helpers import declare, produce_orders
from tests.dagster.test_processing import launch, materialization
from tests.support.spark_concurrency import awaiting_price

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_a_run_shows_its_concurrency_and_ordering_and_processes_every_order(
    topic_name: str, tmp_path: Path, instance: DagsterInstance, kmq: KmqResource,
    audit: AuditStoreResource, pyspark: PySparkResource,
) -> None:  # fmt: skip
    # given a queue declared with an async function, 8 calls at once, in key order
    q = declare(topic_name, tmp_path, instance, kmq, audit, pyspark, function=awaiting_price,
                concurrency=8, ordering="key")  # fmt: skip
    ids = [i for i in range(40) if not is_poison(i) and not is_flaky(i)]
    produce_orders(kmq, topic_name, ids)  # type: ignore[arg-type]

    # when the processing job runs
    result = launch(q)

    # then the definition and the run's materialization say so, and every order was priced
    assert result.success
    figures = materialization(result)
    assert (figures["concurrency"], figures["ordering"]) == (8, "key")
    assert figures["succeeded"] == figures["distinct_rows"] == len(ids)
    definition = q.defs.resolve_assets_def(q.spec.output_asset_key)
    shown = definition.metadata_by_key[q.spec.output_asset_key]
    assert (shown["concurrency"].value, shown["ordering"].value) == (8, "key")
