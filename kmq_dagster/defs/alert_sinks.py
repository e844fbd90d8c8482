"""Alerts and where they go: a generic JSON webhook (retried with backoff) and e-mail over
SMTP here; Slack in :mod:`kmq_dagster.defs.alerts` (through dagster-slack).

A sink that fails is logged and counted by :func:`deliver`; it never stops the caller.

Examples:
    >>> alert = Alert(kind="breaker_open", severity="critical", subject="orders / pricing",
    ...               title="circuit breaker open", text="error rate 90%", key="orders/pricing#7")
    >>> WebhookSink("http://127.0.0.1:9/hook").send(alert)          # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import smtplib
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from typing import Any, Protocol

from kmq_dagster.errors import KmqError
from kmq_dagster.secrets import mask_text

log = logging.getLogger(__name__)


class AlertDeliveryError(KmqError):
    """A sink could not deliver an alert."""


@dataclass(frozen=True)
class Alert:
    """One alert.

    Args:
        kind: ``breaker_open``, ``breaker_half_open``, ``breaker_closed``, ``run_failure`` or
            ``dead_letter_digest``.
        severity: ``critical``, ``warning`` or ``info``.
        subject: what it is about, e.g. the breaker ``orders / pricing`` or a job name.
        key: identifies the event (a breaker and transition id): a receiver can drop repeats.
    """

    kind: str
    severity: str
    subject: str
    title: str
    text: str
    key: str
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """The alert in one line, for logs and chat."""
        return f"[{self.severity}] {self.subject}: {self.title} ({self.text})"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class AlertSink(Protocol):
    name: str

    def send(self, alert: Alert) -> None: ...


class WebhookSink:
    """POSTs each alert as JSON to ``url``; retries ``attempts`` times, doubling the wait from
    ``backoff_s``, on connection errors and 5xx answers (4xx answers are final)."""

    name = "webhook"

    def __init__(
        self, url: str, *, attempts: int = 5, backoff_s: float = 0.5, timeout_s: float = 10
    ) -> None:
        self.url = url
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s

    def send(self, alert: Alert) -> None:
        body = json.dumps(alert.as_json()).encode()
        wait_s = self.backoff_s
        problem = ""
        for attempt in range(1, self.attempts + 1):
            request = urllib.request.Request(
                self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    response.read()
                return
            except urllib.error.HTTPError as exc:
                problem = f"HTTP {exc.code}"
                if exc.code < 500:
                    break
            except (urllib.error.URLError, OSError) as exc:
                problem = str(getattr(exc, "reason", exc))
            if attempt < self.attempts:
                time.sleep(wait_s)
                wait_s *= 2
        raise AlertDeliveryError(
            f"webhook {mask_text(self.url)} did not take the alert after "
            f"{self.attempts} attempts: {problem}"
        )


class EmailSink:
    """Sends each alert as a plain-text e-mail over SMTP."""

    name = "email"

    def __init__(
        self,
        host: str,
        port: int,
        sender: str,
        recipients: Sequence[str],
        *,
        username: str | None = None,
        password: str | None = None,
        starttls: bool = False,
        timeout_s: float = 10,
    ) -> None:
        if not recipients:
            raise KmqError("e-mail alerts need at least one recipient")
        self.host, self.port = host, port
        self.sender, self.recipients = sender, list(recipients)
        self.username, self.password = username, password
        self.starttls = starttls
        self.timeout_s = timeout_s

    def send(self, alert: Alert) -> None:
        message = EmailMessage()
        message["From"] = self.sender
        message["To"] = ", ".join(self.recipients)
        message["Subject"] = f"[kmq {alert.severity}] {alert.subject}: {alert.title}"
        details = "\n".join(f"{k}: {v}" for k, v in alert.details.items())
        message.set_content(f"{alert.text}\n\n{details}\n\nalert key: {alert.key}\n")
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
                if self.starttls:
                    smtp.starttls()
                if self.username and self.password:
                    smtp.login(self.username, self.password)
                smtp.send_message(message)
        except (smtplib.SMTPException, OSError) as exc:
            raise AlertDeliveryError(
                f"SMTP server {self.host}:{self.port} did not take the alert: {mask_text(str(exc))}"
            ) from None


def deliver(alert: Alert, sinks: Sequence[AlertSink]) -> list[str]:
    """Send ``alert`` to every sink; returns the failures (each logged), never raises."""
    failures = []
    for sink in sinks:
        try:
            sink.send(alert)
        except Exception as exc:  # one broken sink must not silence the others
            failures.append(f"{sink.name}: {exc}")
            log.warning("alert %s not delivered by %s: %s", alert.key, sink.name, exc)
    return failures
