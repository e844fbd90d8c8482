"""No secret is ever printed or logged: planted passwords (in the audit store's URL, in client
settings, in a PostgreSQL URL) never appear in errors, logs, help texts or benchmark output."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.errors import AuditStoreError
from kmq_dagster.secrets import mask_config, mask_url
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import LONGEST_WAIT_S
from tests.processes import run_kmq

pytestmark = pytest.mark.kafka

SECRETS = ("planted-Pw-1", "planted-Pw-2", "planted-Pw-3", "planted-Pw-4")


def assert_clean(result: subprocess.CompletedProcess[str]) -> None:
    for secret in SECRETS:
        assert secret not in result.stdout + result.stderr, (secret, result.stderr)


def test_errors_logs_and_help_never_show_a_planted_secret(settings: KmqSettings) -> None:
    env = {
        "KMQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KMQ_REQUEST_TIMEOUT_MS": "3000",
        "KMQ_AUDIT_URL": f"postgresql+psycopg://kmq:{SECRETS[0]}@127.0.0.1:1/db?"
        f"password={SECRETS[1]}&sslpassword={SECRETS[1]}",
        "KMQ_KAFKA_SASL_PASSWORD": SECRETS[2],
    }
    sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=PLAIN",
            "-X", "sasl.username=kmq",
            "-X", f"sasl.oauthbearer.client.secret={SECRETS[3]}"]  # fmt: skip

    runs = [
        run_kmq("discard", "-t", "orders", "-g", "g", env=env),  # the store's URL in the error
        run_kmq("-v", "provision", "-t", "orders", "-p", "1", *sasl, env=env),  # debug logs
        run_kmq("worker", "--help", env=env),
        run_kmq("-v", "send", "-t", "nosuch", "--value", "x", "-X", f"x.y={SECRETS[3]}", env=env),
    ]

    for result in runs:
        assert_clean(result)
    assert runs[0].returncode == 1 and "kmq:***@127.0.0.1:1/db" in runs[0].stderr
    assert runs[1].returncode == 1 and "refused the connection" in runs[1].stderr


def test_bench_output_never_shows_the_postgres_password(postgres_url: str, tmp_path: Path) -> None:
    # the throwaway server trusts local connections: a password in its URL is accepted, unused
    with_password = postgres_url.replace("kmq@", f"kmq:{SECRETS[0]}@", 1)
    assert with_password != postgres_url

    result = run_kmq(
        "bench", "audit", "--rows", "100", "--rounds", "1", "--postgres-url", with_password,
        timeout_s=LONGEST_WAIT_S,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-2000:]
    assert_clean(result)
    assert result.stdout.strip().splitlines()[-1].startswith('{"sqlite_rows_per_s"')


def test_library_errors_and_log_records_are_masked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"postgresql+psycopg://kmq:{SECRETS[0]}@127.0.0.1:1/db?password={SECRETS[1]}"
    with pytest.raises(AuditStoreError) as raised:
        AuditStore(url)
    settings = KmqSettings(client_config={"sasl.password": SECRETS[2], "ssl.key.password": "k3y"})

    logging.getLogger("kmq_dagster.test").warning("connecting with %s and %s", url, settings)

    assert not any(secret in str(raised.value) for secret in SECRETS[:2])
    assert not any(secret in caplog.text for secret in SECRETS[:3])
    assert SECRETS[2] not in repr(settings)
    assert mask_config({"sasl.password": "p", "sasl.username": "u"})["sasl.password"] == "***"
    assert mask_url("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"
