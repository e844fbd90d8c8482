"""A Spring Kafka dead-letter topic in the console: listed under ``<dlt> / spring`` with
Spring's exception class, message and consumer group, grouped by cause, and replayed by an
operator from the dialog to each dead letter's original topic, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console import jobs
from kmq_dagster.console.action_dialogs import TARGETS
from kmq_dagster.console.auth import OPERATOR, Principal
from kmq_dagster.console.dead_letter_grid import original_text
from kmq_dagster.console.operations import ReplayPlan, preview_replay
from kmq_dagster.core.replay import TO_ORIGINAL, TO_RETRY
from kmq_dagster.errors import ConfigError
from kmq_dagster.kafka.foreign_dlq import open_foreign_dlq
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.settings import KmqSettings
from tests.console.apps import button, open_app, texts
from tests.console.test_dead_letters_page import apply_filters, listed, select_rows
from tests.integration.test_spring_dead_letters import (
    EXCEPTION,
    ORIGINAL_PARTITIONS,
    ORIGINS,
    make_spring_dlt,
)
from tests.kafka_helpers import read_topic, wait_for

pytestmark = pytest.mark.kafka

OLIVIA = Principal("olivia", OPERATOR)


@pytest.fixture
def spring_dlt(
    settings: KmqSettings,
    bootstrap_env: None,
    topic_name: str,
    private_audit_store: str,
) -> str:
    """A Spring DLT of 4 well-formed dead letters and one without an origin, ingested."""
    make_spring_dlt(settings, topic_name, f"{topic_name}-dlt")
    store = AuditStore(private_audit_store)
    ingester = DlqIngester(open_foreign_dlq(settings, f"{topic_name}-dlt", "spring"), store)
    ingester.ingest_available()
    ingester.close()
    store.close()
    return f"{topic_name}-dlt"


def test_an_operator_browses_and_replays_a_spring_dlt_to_its_original_topic(
    console_env: Path, settings: KmqSettings, spring_dlt: str, private_audit_store: str
) -> None:
    original = spring_dlt.removesuffix("-dlt")
    app = open_app(OLIVIA, page="dead letters")
    apply_filters(app, queue=f"{spring_dlt} / spring")
    frame = app.dataframe[0].value
    assert len(frame) == 5
    # (the grid cuts long cells, ending them in an ellipsis)
    assert sorted(t[:40] for t in frame["error type"]) == ["java.lang.Error"] + [EXCEPTION[:40]] * 4
    assert "order 13 declined" in set(frame["error message"])
    assert all(reason.startswith("dead-lettered by Spring") for reason in frame["reason"])
    # with where each came from (cut to the column; whole in the stored row's text)
    assert sorted(o[:20] for o in frame["original"]) == ["", *[original[:20]] * 4]
    store = AuditStore(private_audit_store)
    stored = store.dead_letters(DeadLetterFilter(queue_topic=spring_dlt))
    assert sorted(original_text(d) for d in stored) == sorted(
        ["", *(f"{original}[{p}]@{o}" for p, o in ORIGINS)]
    )

    # grouped by cause: Spring's exception class and its message's pattern
    app.segmented_control(key="dead-letters-view").set_value("By cause").run()
    causes = app.dataframe[0].value
    assert sorted(
        (t[:40], n) for t, n in zip(causes["error type"], causes["count"], strict=True)
    ) == [
        ("java.lang.Error", 1),
        (EXCEPTION[:40], 4),
    ]

    # back to "this group" is refused with its reason; the original topic is offered
    where = DeadLetterFilter(queue_topic=spring_dlt, group_id="spring")
    with pytest.raises(ConfigError, match="no kmq group to retry in"):
        preview_replay(OLIVIA, settings, store, ReplayPlan(where, TO_RETRY))

    app.segmented_control(key="dead-letters-view").set_value("List").run()
    # the one without an origin and two others: it is left where it is, and said so
    kinds = list(app.dataframe[0].value["error type"])
    lost = kinds.index("java.lang.Error")
    rows = [lost, *[i for i, kind in enumerate(kinds) if i != lost][:2]]
    select_rows(app, rows)
    app.run()
    chosen = [listed(app)[i] for i in rows[1:]]
    button(app, "Replay selected (3)").click().run()
    original_choice = next(label for label, target in TARGETS.items() if target == TO_ORIGINAL)
    app.selectbox(key="replay-target").select(original_choice).run()
    button(app, "Dry run").click().run()
    shown = texts(app)
    assert "Dry run: 2 dead letters would be replayed to (each dead letter's original topic)." in (
        shown
    )
    assert "left where they are for want of an original topic 1." in shown
    button(app, "Replay 2 dead letters").click().run()
    (job,) = [j for j in jobs.jobs() if j.queue_topic == spring_dlt]
    assert wait_for(lambda: job.state != jobs.RUNNING, timeout_s=60), job
    assert (job.state, job.replayed) == (jobs.FINISHED, 2)

    copies = read_topic(settings, original, ORIGINAL_PARTITIONS, at_least=2)
    replayed = store.dead_letters(DeadLetterFilter(ids=tuple(chosen)))
    assert sorted((c.partition(), c.key()) for c in copies) == sorted(
        (d.original_partition, d.key) for d in replayed
    )
    assert {d.status for d in replayed} == {"replayed"}
    # asked again with a loop guard of one replay, nothing moves: the first one counts
    again = preview_replay(
        OLIVIA,
        settings,
        store,
        ReplayPlan(DeadLetterFilter(ids=tuple(chosen)), TO_ORIGINAL, None, 1),
    )
    assert (again.report.selected, again.report.over_limit, again.report.movable) == (2, 2, 0)
    store.close()
