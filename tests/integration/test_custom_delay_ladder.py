"""A delay queue of chosen levels on the real broker: `kmq provision --delays --delay-levels`
creates exactly those level topics, and `kmq send --delay` and the forwarder use them with no
setting of their own, delivering a message between two levels not before it is due."""

from __future__ import annotations

import json
import time

import pytest

from kmq_dagster.cli import main
from kmq_dagster.core.retry_headers import DUE_MS
from kmq_dagster.kafka.delay_forwarder import DelayForwarder
from kmq_dagster.kafka.message import KmqMessage
from kmq_dagster.kafka.provision_plan import partition_counts
from kmq_dagster.kafka.queues import open_queue
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import running_service, running_worker, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("bootstrap_env")]


def _delay_topics(settings: KmqSettings, topic: str) -> set[str]:
    return {name for name in partition_counts(settings) if name.startswith(f"{topic}.delay.")}


def test_a_chosen_ladder_is_created_exactly_and_delivers_between_its_levels_not_early(
    settings: KmqSettings, topic_name: str, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    provision = ["provision", "-t", topic_name, "-g", group, "-p", "1", "--delays"]
    ladder = {f"{topic_name}.delay.{name}" for name in ("2s", "5s", "dlq")}

    # given the plan of a queue whose delay ladder has the levels 2s and 5s (given unsorted)
    assert main([*provision, "--delay-levels", "5s,2s", "--plan", "--json"]) == 0
    planned = {t["topic"]: t for t in json.loads(capsys.readouterr().out)["topics"]}
    # then the plan lists exactly those level topics and the delay DLQ, each level kept at
    # least a week
    assert {name for name in planned if name.startswith(f"{topic_name}.delay.")} == ladder
    week = {"retention.ms": str(7 * 86_400_000)}
    assert planned[f"{topic_name}.delay.5s"]["config"] == week

    # when it is provisioned: exactly the planned delay topics exist
    assert main([*provision, "--delay-levels", "5s,2s"]) == 0
    capsys.readouterr()
    assert _delay_topics(settings, topic_name) == ladder

    # when a message is sent with `kmq send` delayed by 3s, between the two levels, while a
    # forwarder and a worker run (neither is told the levels)
    handled: list[tuple[float, KmqMessage]] = []
    opened = open_queue(settings, topic_name, group)
    with (
        running_service(DelayForwarder(settings, topic_name)) as forwarder,
        running_worker(opened, lambda message: handled.append((time.time(), message))),
    ):
        assert wait_for(forwarder.assignment_ready, timeout_s=60)
        sent_at = time.time()
        send = ["send", "--topic", topic_name, "--delay", "3s", "--value", "between"]
        assert main(send) == 0
        out = capsys.readouterr().out
        assert "due in 3s" in out and "smallest delay level" not in out
        assert wait_for(lambda: len(handled) == 1, timeout_s=60), "not delivered"

    # then the worker had it once, not before it was due
    ((handled_at, message),) = handled
    due_ms = int(dict(message.headers)[DUE_MS] or b"0")
    assert message.value == b"between"
    assert due_ms >= sent_at * 1000 + 3_000
    assert handled_at * 1000 >= due_ms, "handled before its due time"
    assert message.timestamp_ms >= due_ms, "delivered before its due time"
    assert forwarder.levels_ms == (2_000, 5_000) and forwarder.stats.delivered == 1
    # and no topic of another ladder appeared (e.g. the default ladder's 1s level)
    assert _delay_topics(settings, topic_name) == ladder


def test_a_ladder_is_kept_when_provisioned_again_and_other_levels_are_refused(
    settings: KmqSettings, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    provision = ["provision", "-t", topic_name, "-p", "1", "--delays"]
    assert main([*provision, "--delay-levels", "10s,1m"]) == 0
    ladder = _delay_topics(settings, topic_name)
    capsys.readouterr()

    # when a message is sent with a delay shorter than the smallest level, the user is told
    # when it will arrive (nothing is delivered here: no forwarder runs)
    assert main(["send", "--topic", topic_name, "--delay", "2s", "--value", "soon"]) == 0
    assert capsys.readouterr().out.endswith(
        f"due in 2s; `kmq delayer --topic {topic_name}` delivers them after about 10s, the "
        f"smallest delay level of {topic_name}\n"
    )

    # when provisioned again with --delays alone, or with the same levels: nothing changes
    assert main(provision) == 0
    assert main([*provision, "--delay-levels", "1m,10s"]) == 0
    assert capsys.readouterr().out.count("nothing to change") == 2

    # when provisioned with other levels: one clear line, nothing created
    assert main([*provision, "--delay-levels", "10s,1m,1h"]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"kmq: error: {topic_name} has a delay queue with levels 10s,1m, ")
    assert "not 10s,1m,1h; kmq does not change a delay ladder" in error
    assert error.count("\n") == 1
    # bad levels, or levels without --delays, are refused before anything is looked up
    assert main([*provision, "--delay-levels", "10s,10s"]) == 1
    assert capsys.readouterr().err.startswith("kmq: error: --delay-levels: delay levels are ")
    assert main(["provision", "-t", topic_name, "--delay-levels", "10s"]) == 2
    assert "--delay-levels goes with --delays" in capsys.readouterr().err
    assert _delay_topics(settings, topic_name) == ladder
    assert ladder == {f"{topic_name}.delay.{name}" for name in ("10s", "1m", "dlq")}
