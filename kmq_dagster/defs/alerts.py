"""Alert sinks as a Dagster resource, Slack through dagster-slack, and the run-failure sensor.

Alerts always go to the Dagster log (and breaker transitions to the asset check); the sinks
configured here are extra: Slack (``pip install dagster-slack``), a JSON webhook, and
e-mail over SMTP.

No ``from __future__ import annotations`` here: Dagster reads the sensor's resource parameter
at run time.

Examples:
    >>> from dagster import EnvVar
    >>> alerts = KmqAlertsResource(
    ...     webhook_url="https://hooks.example.com/kmq",
    ...     slack_token=EnvVar("SLACK_TOKEN"), slack_channel="#queues",
    ...     smtp_host="mail.example.com", smtp_sender="kmq@example.com",
    ...     smtp_recipients=["oncall@example.com"],
    ... )
"""

import warnings
from collections.abc import Sequence
from typing import Any

from dagster import (
    ConfigurableResource,
    DefaultSensorStatus,
    JobDefinition,
    RunFailureSensorContext,
    SensorDefinition,
    run_failure_sensor,
)
from dagster._utils.warnings import BetaWarning
from pydantic import Field

from kmq_dagster.defs.alert_sinks import Alert, AlertSink, EmailSink, WebhookSink, deliver
from kmq_dagster.errors import ConfigError


class SlackSink:
    """Posts each alert to a Slack channel with dagster-slack's client."""

    name = "slack"

    def __init__(self, token: str, channel: str, *, base_url: str | None = None) -> None:
        try:
            from dagster_slack import SlackResource
        except ImportError:
            raise ConfigError(
                "Slack alerts need dagster-slack: pip install dagster-slack (the slack extra: "
                "pip install -e '.[slack]' in a clone)"
            ) from None
        client = SlackResource(token=token).get_client()
        if base_url is not None:  # a Slack-compatible server (tests, Enterprise Grid proxies)
            client.base_url = base_url
        self.client = client
        self.channel = channel

    def send(self, alert: Alert) -> None:
        self.client.chat_postMessage(channel=self.channel, text=alert.line())


class KmqAlertsResource(ConfigurableResource):  # type: ignore[type-arg]
    """Where kmq's alerts go besides the Dagster log; every sink is optional."""

    webhook_url: str | None = Field(default=None, description="POST each alert as JSON here")
    webhook_attempts: int = Field(default=5, description="tries per alert, backoff doubling")
    webhook_backoff_s: float = Field(default=0.5, description="first wait between tries")
    slack_token: str | None = Field(default=None, description="Slack bot token (use EnvVar)")
    slack_channel: str | None = Field(default=None, description="e.g. #queues")
    slack_base_url: str | None = Field(default=None, description="another Slack API address")
    smtp_host: str | None = Field(default=None, description="SMTP server for e-mail alerts")
    smtp_port: int = Field(default=25)
    smtp_sender: str = Field(default="kmq@localhost")
    smtp_recipients: list[str] = Field(default_factory=list)
    smtp_username: str | None = Field(default=None)
    smtp_password: str | None = Field(default=None, description="use EnvVar")
    smtp_starttls: bool = Field(default=False)
    min_period_s: float = Field(
        default=300.0,
        description="at most one alert per breaker in this many seconds while it flaps "
        "(a resolve message after an announced problem is always sent at once)",
    )

    def get_sinks(self) -> list[AlertSink]:
        """The configured sinks (none: alerts go to the Dagster log only)."""
        sinks: list[AlertSink] = []
        if self.webhook_url:
            sinks.append(
                WebhookSink(
                    self.webhook_url,
                    attempts=self.webhook_attempts,
                    backoff_s=self.webhook_backoff_s,
                )
            )
        if self.slack_token and self.slack_channel:
            sinks.append(
                SlackSink(self.slack_token, self.slack_channel, base_url=self.slack_base_url)
            )
        if self.smtp_host:
            sinks.append(
                EmailSink(
                    self.smtp_host,
                    self.smtp_port,
                    self.smtp_sender,
                    self.smtp_recipients,
                    username=self.smtp_username,
                    password=self.smtp_password,
                    starttls=self.smtp_starttls,
                )
            )
        return sinks

    def send(self, alert: Alert, log: Any = None) -> list[str]:
        """Send ``alert`` to every sink and to ``log`` (a Dagster logger); returns failures."""
        if log is not None:
            log.warning(f"kmq alert: {alert.line()}")
        failures = deliver(alert, self.get_sinks())
        if failures and log is not None:
            log.error(f"alert {alert.key} not delivered: {'; '.join(failures)}")
        return failures


#: Every kmq job's runs carry a tag starting so (``kmq/queue``, ``kmq/housekeeping``).
KMQ_TAG_PREFIX = "kmq/"


def make_run_failure_alert_sensor(
    jobs: Sequence[JobDefinition | Any] | None,
    *,
    name: str = "kmq_run_failures",
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """A sensor that sends every failure of ``jobs`` to the alert sinks; ``None``: of every
    run of the code location carrying a ``kmq/`` tag (for a code location whose kmq jobs come
    from several components, none of which knows the others' jobs)."""
    with warnings.catch_warnings():  # dagster's own decorator passes a beta parameter
        warnings.simplefilter("ignore", BetaWarning)
        decorate = run_failure_sensor(
            name=name,
            monitored_jobs=None if jobs is None else list(jobs),
            default_status=default_status,
            description="Sends failures of kmq jobs to the alert sinks.",
        )

    def kmq_run_failures(context: RunFailureSensorContext, alerts: KmqAlertsResource) -> None:
        run = context.dagster_run
        if jobs is None and not any(tag.startswith(KMQ_TAG_PREFIX) for tag in run.tags):
            return  # not a kmq run: the code location's other jobs are not ours to alert on
        message = context.failure_event.message or "the run failed"
        alert = Alert(
            kind="run_failure",
            severity="critical",
            subject=run.job_name,
            title=f"run {run.run_id} failed",
            text=message,
            key=f"run-failure:{run.run_id}",
            details={"run_id": run.run_id, **{k: v for k, v in run.tags.items() if "kmq" in k}},
        )
        alerts.send(alert, context.log)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        return decorate(kmq_run_failures)
