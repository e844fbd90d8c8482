"""Alert sinks against real local servers: a webhook retried with backoff, e-mail over SMTP,
Slack's Web API through dagster-slack's client; and the run-failure sensor."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import DagsterInstance, build_run_status_sensor_context, job, op

from kmq_dagster.defs.alert_sinks import Alert, AlertDeliveryError, EmailSink, WebhookSink
from kmq_dagster.defs.alerts import KmqAlertsResource, make_run_failure_alert_sensor
from tests.dagster.receivers import http_receiver, smtp_receiver

ALERT = Alert(
    kind="breaker_open",
    severity="critical",
    subject="orders / pricing",
    title="circuit breaker open",
    text="closed -> open: error rate 90% over 40 messages in 30s",
    key="orders/pricing#transition-7",
    details={"transition_id": 7},
)


def test_the_webhook_is_retried_with_backoff_until_it_takes_the_alert() -> None:
    with http_receiver(fail_first=2) as receiver:
        WebhookSink(receiver.url + "/hook", attempts=3, backoff_s=0.01).send(ALERT)
    assert receiver.attempts == 3
    assert receiver.bodies() == [ALERT.as_json()]


def test_a_webhook_that_refuses_the_alert_is_an_error_naming_it() -> None:
    with http_receiver(status=200, fail_first=5) as receiver:
        sink = WebhookSink(receiver.url, attempts=2, backoff_s=0.01)
        with pytest.raises(AlertDeliveryError, match="after 2 attempts: HTTP 503"):
            sink.send(ALERT)
    assert receiver.attempts == 2


def test_an_alert_arrives_by_email() -> None:
    with smtp_receiver() as (port, inbox):
        EmailSink("127.0.0.1", port, "kmq@localhost", ["oncall@example.com"]).send(ALERT)
    (message,) = inbox
    assert message["Subject"] == "[kmq critical] orders / pricing: circuit breaker open"
    assert message["To"] == "oncall@example.com"
    assert "error rate 90%" in message.get_payload()


def test_the_resource_sends_to_slack_webhook_and_email_alike() -> None:
    with http_receiver() as slack, http_receiver() as hook, smtp_receiver() as (port, inbox):
        alerts = KmqAlertsResource(
            webhook_url=hook.url,
            slack_token="xoxb-test",
            slack_channel="#queues",
            slack_base_url=slack.url + "/api/",
            smtp_host="127.0.0.1",
            smtp_port=port,
            smtp_recipients=["oncall@example.com"],
        )
        assert alerts.send(ALERT) == []
    ((path, body),) = slack.received
    assert path == "/api/chat.postMessage"
    assert "circuit breaker open" in str(body)
    assert hook.bodies() == [ALERT.as_json()]
    assert len(inbox) == 1


def test_a_failed_kmq_run_is_sent_to_the_sinks(instance: DagsterInstance) -> None:
    @op
    def breaks() -> None:
        raise RuntimeError("the handler module is gone")

    @job
    def process_orders__pricing() -> None:
        breaks()

    result = process_orders__pricing.execute_in_process(instance=instance, raise_on_error=False)
    failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
    sensor = make_run_failure_alert_sensor([process_orders__pricing])
    with http_receiver() as hook:
        alerts = KmqAlertsResource(webhook_url=hook.url)
        context = build_run_status_sensor_context(
            sensor_name=sensor.name,
            dagster_event=failure,
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            resources={"alerts": alerts},
        ).for_run_failure()
        sensor(context)
    (body,) = hook.bodies()
    assert body["kind"] == "run_failure"
    assert body["subject"] == "process_orders__pricing"
    assert body["key"] == f"run-failure:{result.run_id}"


def alerts_sent_for(job_tags: dict[str, str], instance: DagsterInstance) -> list[Any]:
    """What the code-location-wide failure sensor (no job list, as the dg components make
    it) sends for a failed run of a job with these tags."""

    @op
    def breaks() -> None:
        raise RuntimeError("the handler module is gone")

    @job(tags=job_tags)
    def some_job() -> None:
        breaks()

    result = some_job.execute_in_process(instance=instance, raise_on_error=False)
    failure = next(e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE")
    sensor = make_run_failure_alert_sensor(None)
    with http_receiver() as hook:
        context = build_run_status_sensor_context(
            sensor_name=sensor.name,
            dagster_event=failure,
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            resources={"alerts": KmqAlertsResource(webhook_url=hook.url)},
        ).for_run_failure()
        sensor(context)
    return hook.bodies()


def test_the_location_wide_failure_sensor_alerts_on_kmq_runs_only(
    instance: DagsterInstance,
) -> None:
    (body,) = alerts_sent_for({"kmq/queue": "payments", "kmq/group": "billing"}, instance)
    assert body["kind"] == "run_failure"
    assert body["details"]["kmq/queue"] == "payments"
    # another job of the user's code location: not kmq's to alert on
    assert alerts_sent_for({"team": "finance"}, instance) == []
