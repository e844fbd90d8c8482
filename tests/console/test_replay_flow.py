"""The replay flow of the console in ``AppTest`` against the real broker: select rows, dry run,
confirm the named count and target, the background replay, the audit trail, the copies
processed by the group, and the history naming each copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.history import history
from kmq_dagster.audit.history_events import REPLAY
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console import jobs
from kmq_dagster.console.auth import OPERATOR, Principal
from kmq_dagster.console.copies import copy_fates
from kmq_dagster.console.operations import ReplayPlan, discard, start_replay
from kmq_dagster.console.rendering import key_text
from kmq_dagster.core.naming import redelivery_topic
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.consumer import KmqMessage
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.settings import KmqSettings
from tests.console.apps import button, open_app, texts
from tests.console.test_dead_letters_page import apply_filters, listed, select_rows
from tests.kafka_helpers import (
    new_queue,
    produce_dead_letters,
    read_topic,
    running_worker,
    wait_for,
)

pytestmark = pytest.mark.kafka


@pytest.fixture
def queue(
    settings: KmqSettings,
    bootstrap_env: None,
    topic_name: str,
    group: str,
    private_audit_store: str,
) -> str:
    """A queue whose DLQ holds 15 dead letters, ingested into the test's audit store."""
    defined = new_queue(settings, topic_name, group, partitions=2, retry_delays_ms=(1_000, 60_000))
    produce_dead_letters(settings, defined, [(f"k{i}", "TimeoutError") for i in range(15)])
    store = AuditStore(private_audit_store)
    ingester = DlqIngester(defined, store)
    ingester.ingest_available()
    ingester.close()
    store.close()
    return topic_name


def test_an_operator_replays_ten_selected_dead_letters_after_a_dry_run_and_they_are_processed(
    console_env: Path, settings: KmqSettings, queue: str, group: str, private_audit_store: str
) -> None:
    store = AuditStore(private_audit_store)
    app = open_app(Principal("olivia", OPERATOR), page="dead letters")
    apply_filters(app, queue=f"{queue} / {group}")
    select_rows(app, list(range(10)))
    app.run()
    chosen = listed(app)[:10]

    button(app, "Replay selected (10)").click().run()
    assert "Run a dry run to see what would move." in texts(app)
    button(app, "Dry run").click().run()
    target = redelivery_topic(queue, group)  # back to this group only
    assert f"Dry run: 10 dead letters would be replayed to {target}." in texts(app)
    (sample,) = [d.value for d in app.dataframe if "DLQ position" in d.value]
    chosen_rows = store.dead_letters(DeadLetterFilter(ids=tuple(chosen)))
    keys = {key_text(d.key) for d in chosen_rows}
    assert set(sample["key"]) <= keys and len(sample) == 10  # as the list shows them, not b'..'
    assert store.count_dead_letters(DeadLetterFilter(status="replayed")) == 0
    button(app, "Replay 10 dead letters").click().run()

    (job,) = [j for j in jobs.jobs() if j.queue_topic == queue]
    assert f"Replay {job.replay_id} started: 10 dead letters to {target}" in texts(app)
    assert wait_for(lambda: job.state != jobs.RUNNING, timeout_s=60), job
    assert (job.state, job.replayed) == (jobs.FINISHED, 10)
    replayed = store.dead_letters(DeadLetterFilter(queue_topic=queue, status="replayed"))
    assert sorted(d.id for d in replayed) == sorted(chosen)
    dry, real = store.actions(queue_topic=queue)
    assert (dry.actor, dry.dry_run, dry.count) == ("olivia", True, 10)
    assert (real.actor, real.dry_run, real.count, real.target) == ("olivia", False, 10, target)
    assert f"(replay id {job.replay_id})" in real.selection  # one replay, one id

    steps = history(store, replayed[0])
    assert [(s.kind, s.actor, s.copy_topic) for s in steps][-1] == (REPLAY, "olivia", target)
    assert copy_fates(settings, group, steps) == {1: f"waiting for {group} (committed there: None)"}

    processed: list[KmqMessage] = []
    with running_worker(open_queue(settings, queue, group), processed.append):
        assert wait_for(lambda: len(processed) == 10, timeout_s=60)
        picked_up = f"picked up by {group}; not dead-lettered again"
        assert wait_for(lambda: copy_fates(settings, group, steps) == {1: picked_up})
    assert sorted(m.key or b"" for m in processed) == sorted(d.key or b"" for d in replayed)
    apply_filters(app, status="replayed", key=(replayed[0].key or b"").decode())
    app.selectbox[-1].select(replayed[0].id).run()
    fates = list(app.dataframe[-1].value["what became of it"])
    assert fates == ["", picked_up]
    actions_page = open_app(Principal("olivia", OPERATOR), page="actions")
    assert "replayed 10 of 15 dead letters" in texts(actions_page)
    store.close()


def test_two_tabs_replaying_the_same_dead_letters_at_once_replay_each_of_them_once(
    settings: KmqSettings, queue: str, group: str, private_audit_store: str
) -> None:
    # given two operators on the same filter, replaying at 10 a second (1.5 s for 15)
    store = AuditStore(private_audit_store)
    plan = ReplayPlan(DeadLetterFilter(queue_topic=queue, group_id=group), rate_per_s=10)

    # when both click Replay at once
    first = start_replay(Principal("olivia", OPERATOR), settings, store, plan)
    second = start_replay(Principal("oscar", OPERATOR), settings, store, plan)

    # then one replays all 15 while the other waits, and finds nothing left
    assert wait_for(lambda: jobs.RUNNING not in (first.state, second.state), timeout_s=60)
    assert sorted([first.replayed, second.replayed]) == [0, 15], (first, second)
    copies = read_topic(settings, redelivery_topic(queue, group), 2, at_least=15)
    assert sorted(r.key() or b"" for r in copies) == sorted(f"k{i}".encode() for i in range(15))
    store.close()


def test_a_discard_while_a_replay_of_the_same_queue_runs_is_refused_not_left_hanging(
    settings: KmqSettings, queue: str, group: str, private_audit_store: str
) -> None:
    store = AuditStore(private_audit_store)
    olivia = Principal("olivia", OPERATOR)
    where = DeadLetterFilter(queue_topic=queue, group_id=group)
    job = start_replay(olivia, settings, store, ReplayPlan(where, rate_per_s=5))
    assert wait_for(lambda: job.replayed > 0, timeout_s=60), job

    with pytest.raises(ConfigError, match=r"action #\d+ \(replay by olivia\) is running"):
        discard(olivia, store, where, reason="stale")

    assert wait_for(lambda: job.state != jobs.RUNNING, timeout_s=60), job
    assert discard(olivia, store, where, reason="stale") == 0  # all replayed by now
    kinds = [(a.kind, a.state) for a in store.actions(queue_topic=queue)]
    assert kinds == [("replay", "succeeded"), ("discard", "failed"), ("discard", "succeeded")]
    store.close()
