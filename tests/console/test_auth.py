"""Login and roles: the users file with argon2 hashes, and the acting functions refusing a
viewer themselves (called directly, not through hidden buttons), changing nothing."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kmq_dagster.audit.filters import DeadLetterFilter
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console import jobs, operations
from kmq_dagster.console.auth import ADMIN, OPERATOR, VIEWER, Principal, UsersFile
from kmq_dagster.console.operations import ReplayPlan
from kmq_dagster.core.naming import redelivery_topic
from kmq_dagster.errors import ConfigError, PermissionDeniedError
from kmq_dagster.operations.dlq_ingester import DlqIngester
from kmq_dagster.settings import KmqSettings
from tests.kafka_helpers import new_queue, produce_dead_letters, read_topic

ROOT = Principal("root@host", ADMIN)
PASSWORD = "correct horse battery"


def test_a_user_added_to_the_file_logs_in_with_their_password_only(tmp_path: Path) -> None:
    users = UsersFile(tmp_path / "users.json")

    users.add(ROOT, "olivia", OPERATOR, PASSWORD)
    users.add(ROOT, "victor", VIEWER, PASSWORD + "!")
    users.add(ROOT, "sso@example.com", ADMIN, None)

    assert users.authenticate("olivia", PASSWORD) == Principal("olivia", OPERATOR)
    assert users.authenticate("olivia", PASSWORD + "!") is None
    assert users.authenticate("nobody", PASSWORD) is None
    assert users.authenticate("sso@example.com", "") is None  # an OIDC identity has no password
    assert users.role_of("sso@example.com") == ADMIN
    stored = (tmp_path / "users.json").read_text()
    assert PASSWORD not in stored and "$argon2id$" in stored
    assert stat.S_IMODE((tmp_path / "users.json").stat().st_mode) == 0o600


def test_roles_include_each_other_and_bad_input_is_refused(tmp_path: Path) -> None:
    users = UsersFile(tmp_path / "users.json")

    assert Principal("a", ADMIN).has(OPERATOR) and Principal("o", OPERATOR).has(VIEWER)
    assert not Principal("v", VIEWER).has(OPERATOR)
    with pytest.raises(ConfigError, match="role must be one of"):
        users.add(ROOT, "x", "superuser", PASSWORD)
    with pytest.raises(ConfigError, match="at least 10 characters"):
        users.add(ROOT, "x", VIEWER, "short")
    with pytest.raises(ConfigError, match="non-empty"):
        users.add(ROOT, " ", VIEWER, PASSWORD)
    (tmp_path / "broken.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a kmq console users file"):
        UsersFile(tmp_path / "broken.json").entries()


@pytest.mark.parametrize("role", [VIEWER, OPERATOR])
def test_only_an_admin_adds_users(tmp_path: Path, role: str) -> None:
    users = UsersFile(tmp_path / "users.json")

    with pytest.raises(PermissionDeniedError, match=f"is a {role}: adding a user needs"):
        users.add(Principal("someone", role), "mallory", ADMIN, PASSWORD)

    assert users.entries() == {}


@pytest.mark.kafka
def test_a_viewer_can_neither_replay_nor_discard_nor_cancel_and_nothing_changes(
    settings: KmqSettings, topic_name: str, tmp_path: Path
) -> None:
    queue = new_queue(settings, topic_name, "g", retry_delays_ms=(1000,))
    produce_dead_letters(settings, queue, [("a", "TimeoutError")])
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    ingester = DlqIngester(queue, store)
    ingester.ingest_available()
    ingester.close()
    viewer = Principal("victor", VIEWER)
    everything = DeadLetterFilter(queue_topic=topic_name)
    job = jobs.ReplayJob("olivia", topic_name, "g", "t", expected=1)

    with pytest.raises(PermissionDeniedError, match="victor is a viewer: replaying"):
        operations.preview_replay(viewer, settings, store, ReplayPlan(everything))
    with pytest.raises(PermissionDeniedError, match="replaying dead letters needs the operator"):
        operations.start_replay(viewer, settings, store, ReplayPlan(everything))
    with pytest.raises(PermissionDeniedError, match="discarding dead letters needs"):
        operations.discard(viewer, store, everything, reason="cleanup")
    with pytest.raises(PermissionDeniedError, match="cancelling a replay needs"):
        operations.cancel_replay(viewer, job)

    assert not job.cancel.is_set()
    assert [d.status for d in store.dead_letters(everything)] == ["new"]
    assert store.actions() == []
    assert read_topic(settings, redelivery_topic(topic_name, "g"), 1, timeout_s=2) == []
    with pytest.raises(ConfigError, match="needs a reason"):
        operations.discard(Principal("olivia", OPERATOR), store, everything, reason=" ")
    store.close()
