"""A secret in the Kafka client settings never reaches a Dagster run's logs (issue 13)."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance
from dagster._serdes import serialize_value

from kmq_dagster.core.queue import Queue
from kmq_dagster.defs import QueueSpec, kmq_definitions
from kmq_dagster.defs.resources import KmqResource
from kmq_dagster.settings import KmqSettings

PLANTED = "planted-Secret-4711"


@pytest.mark.kafka
def test_a_planted_sasl_password_is_masked_in_run_logs_and_console(
    settings: KmqSettings,
    topic_name: str,
    instance: DagsterInstance,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KMQ_REQUEST_TIMEOUT_MS", "4000")
    # given: credentials the plaintext test broker cannot accept
    kmq = KmqResource(
        bootstrap_servers=settings.bootstrap_servers,
        client_config={
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "kmq",
            "sasl.password": PLANTED,
            "socket.timeout.ms": "3000",
        },
    )
    spec = QueueSpec(Queue(topic_name, "g", partitions=1))
    job = kmq_definitions([spec], kmq=kmq).resolve_job_def(spec.job_name("provision"))

    # when: a run uses them and fails
    result = job.execute_in_process(instance=instance, raise_on_error=False)

    # then: the failure is reported, and the secret appears nowhere
    assert not result.success
    entries = instance.all_logs(result.run_id)
    assert any(entry.dagster_event and entry.dagster_event.is_failure for entry in entries)
    logged = "\n".join(serialize_value(entry) for entry in entries)
    assert "Kafka" in logged
    assert PLANTED not in logged
    captured = capfd.readouterr()
    assert PLANTED not in captured.out + captured.err
