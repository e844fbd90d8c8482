"""`kmq bench ack --tracing`'s traced run: Worker drains a queue with tracing on, and the
figures compare it with the untraced run of the same round."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kmq_dagster.bench import ack_worker
from kmq_dagster.bench.ack_worker import TRACED_RUN, WorkerFigures, tracing_on, worker_plan
from kmq_dagster.settings import KmqSettings
from kmq_dagster.tracing import tracing_active

pytestmark = pytest.mark.kafka

MESSAGES = 2_000


def test_the_traced_run_drains_every_message_with_tracing_on_and_restores_it(
    settings: KmqSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given the plan of `kmq bench ack --tracing`, its spans kept to be counted
    spans = InMemorySpanExporter()
    monkeypatch.setattr(ack_worker, "tracing_on", lambda: tracing_on(spans))
    plan = worker_plan(MESSAGES, 1, tracing=True)
    with tracing_on():
        assert tracing_active()  # what the traced run drains under
    assert not tracing_active()

    # when its traced and untraced Worker runs drain a queue each
    figures = WorkerFigures(MESSAGES, traced=True)
    for name in ("worker_n1", TRACED_RUN):
        figures.runs[name].append(plan[name](settings))

    # then each handled every message, the traced run in a span each, tracing is off again,
    # and the ratio is reported
    assert figures.handled(TRACED_RUN) == figures.handled("worker_n1") == MESSAGES
    processed = [span for span in spans.get_finished_spans() if span.name.startswith("process")]
    assert len(processed) == MESSAGES
    assert not tracing_active()
    traced = figures.traced_figures()
    assert set(traced) == {"worker_n1_traced_msgs_per_s", "tracing_ratio"}
    assert traced["worker_n1_traced_msgs_per_s"] > 0 and traced["tracing_ratio"] > 0


def test_without_tracing_the_plan_and_figures_are_unchanged() -> None:
    assert TRACED_RUN not in worker_plan(MESSAGES, 1)
    assert WorkerFigures(MESSAGES).traced_figures() == {}
