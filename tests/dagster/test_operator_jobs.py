"""Operator jobs on the real broker and audit store: ingest, replay and discard launch with no
config (replay and discard as dry runs), take typed config, and write their audit rows under the
run's actor."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import ExecuteInProcessResult

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.defs.resources import AuditStoreResource, KmqResource
from kmq_dagster.kafka.provision_plan import partition_counts
from kmq_dagster.kafka.queues import open_queue
from tests.dagster.helpers import QueueUnderTest
from tests.kafka_helpers import produce_dead_letters, read_topic

pytestmark = pytest.mark.kafka


def run(q: QueueUnderTest, what: str, config: dict[str, Any] | None = None,
        actor: str | None = None) -> ExecuteInProcessResult:  # fmt: skip
    job = q.defs.resolve_job_def(q.spec.job_name(what))
    (op_name,) = [node.name for node in job.graph.nodes]
    run_config = {"ops": {op_name: {"config": config}}} if config else None
    tags = {"kmq/actor": actor} if actor else None
    result = job.execute_in_process(instance=q.instance, run_config=run_config, tags=tags)
    assert result.success
    return result


def test_ingest_replay_and_discard_are_audited_under_the_runs_actor(
    topic_name: str, kmq: KmqResource, audit: AuditStoreResource, demo: QueueUnderTest
) -> None:
    dead = [("a", "TimeoutError"), ("b", "TimeoutError"), ("c", "ValueError"), ("d", "ValueError")]
    produce_dead_letters(kmq.get_settings(), demo.spec.queue, dead)
    store = audit.get_store()

    run(demo, "ingest")
    run(demo, "replay")  # no config: a dry run of everything
    run(demo, "replay", {"error_type": "TimeoutError", "dry_run": False}, actor="alice")
    run(demo, "discard")  # no config: a dry run
    run(demo, "discard", {"error_type": "ValueError", "dry_run": False}, actor="bob")

    assert store.count_dead_letters() == 4
    statuses = sorted((d.key, d.status) for d in store.dead_letters())
    assert statuses == [
        (b"a", "replayed"), (b"b", "replayed"), (b"c", "discarded"), (b"d", "discarded"),
    ]  # fmt: skip
    copies = read_topic(kmq.get_settings(), demo.spec.queue.redelivery_topic, 2, at_least=2)
    assert sorted(c.key() or b"" for c in copies) == [b"a", b"b"]
    actions = [(a.kind, a.actor, a.dry_run, a.count) for a in store.actions(topic_name)]
    assert actions[0][0] == "provision"
    assert actions[1][0] == "ingest" and actions[1][3] == 4
    assert actions[2][0] == "replay" and actions[2][2] is True
    assert actions[3][:3] == ("replay", "alice", False)
    assert actions[4][0] == "discard" and actions[4][2] is True
    assert actions[5] == ("discard", "bob", False, 2)


@pytest.mark.parametrize("offsets", ["", " "])
def test_an_empty_offsets_selection_fails_the_replay_job_and_replays_nothing(
    offsets: str, kmq: KmqResource, audit: AuditStoreResource, demo: QueueUnderTest
) -> None:
    """``offsets: ""`` is a selection of nothing written wrong, not "no filter": it must not
    replay every dead letter (as ``kmq replay --offsets ""`` refuses it)."""
    produce_dead_letters(kmq.get_settings(), demo.spec.queue, [("a", "TimeoutError")])
    run(demo, "ingest")

    job = demo.defs.resolve_job_def(demo.spec.job_name("replay"))
    (op_name,) = [node.name for node in job.graph.nodes]
    config = {"ops": {op_name: {"config": {"offsets": offsets, "dry_run": False}}}}
    result = job.execute_in_process(instance=demo.instance, run_config=config, raise_on_error=False)

    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "offsets are PARTITION:FIRST[-LAST]" in str(failure.step_failure_data.error)
    assert [d.status for d in audit.get_store().dead_letters()] == ["new"]


def test_the_provision_job_redefines_the_retry_policy_when_told(
    topic_name: str, audit: AuditStoreResource, settings: Any, demo: QueueUnderTest
) -> None:
    result = run(demo, "provision", {"retry_delays": "2s,20s", "redefine": True}, actor="carol")

    # the run's output metadata holds the plan it carried out: the two new retry topics of 1
    # partition (half the queue's 2) created; the queue's 6 topics (queue and markers of 2
    # partitions, redelivery, 2 retry topics, DLQ of 1; no delay queue unless asked for) hold 8
    (output,) = [e for e in result.all_node_events if e.is_successful_output]
    metadata: dict[str, Any] = {
        key: value.value for key, value in output.step_output_data.metadata.items()
    }
    assert (metadata["created_partitions"], metadata["queue_partitions"]) == (2, 8)
    created = [t["topic"] for t in metadata["plan"]["topics"] if not t["exists"]]
    assert created == [f"{topic_name}.{demo.spec.queue.group}.retry.{d}" for d in ("2s", "20s")]
    stored = open_queue(settings, topic_name, demo.spec.queue.group)
    assert stored.queue.retry_policy.delays_ms == (2_000, 20_000)
    last = audit.get_store().actions(topic_name)[-1]
    assert (last.kind, last.actor, last.selection) == (
        "provision", "carol", stored.queue.retry_policy.describe(),
    )  # fmt: skip


def test_the_provision_job_creates_a_delay_queue_of_the_levels_it_is_given(
    topic_name: str, kmq: KmqResource, demo: QueueUnderTest
) -> None:
    run(demo, "provision", {"delays": True, "delay_levels": "1m,1s"})

    existing = partition_counts(kmq.get_settings())
    assert {name for name in existing if name.startswith(f"{topic_name}.delay.")} == {
        f"{topic_name}.delay.{name}" for name in ("1s", "1m", "dlq")
    }


def test_the_ingest_job_ingests_a_spring_dead_letter_topic_when_told(
    topic_name: str, kmq: KmqResource, audit: AuditStoreResource, demo: QueueUnderTest
) -> None:
    from tests.integration.test_spring_dead_letters import EXCEPTION, make_spring_dlt

    dlt = f"{topic_name}-spring-dlt"
    make_spring_dlt(kmq.get_settings(), f"{topic_name}-spring", dlt)

    run(demo, "ingest", {"dlq_topic": dlt, "dead_letter_format": "spring"}, actor="dora")

    store = audit.get_store()
    rows = store.dead_letters(DeadLetterFilter(queue_topic=dlt, group_id="spring"))
    assert sorted(d.error_type for d in rows) == ["java.lang.Error"] + [EXCEPTION] * 4
    assert {d.original_topic for d in rows} == {f"{topic_name}-spring", None}
    (action,) = store.actions(dlt)
    assert (action.kind, action.actor, action.count) == ("ingest", "dora", 5)
