"""Login that resists: backoff per name and per client before any hashing, failed logins logged
and audited, at most a few argon2 hashes at once (real argon2, 30 concurrent logins), the role
re-read on every run, idle sessions sent back to the login page, and a users file that two
concurrent ``kmq console add-user`` both write into."""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console import auth
from kmq_dagster.console.auth import OPERATOR, VIEWER, LoginBusyError, Principal, UsersFile
from kmq_dagster.console.config import IDLE_TIMEOUT_ENV
from kmq_dagster.console.login_guard import LOGIN_FAILED, LoginThrottledError, log_in
from kmq_dagster.console.session import ACTIVITY_KEY, Activity
from kmq_dagster.core.login_throttle import (
    FIRST_LOCK_MS,
    FREE_FAILURES,
    MAX_LOCK_MS,
    LoginThrottle,
    client_key,
    user_key,
)
from tests.console.apps import APP, enroll, has_button, open_app, texts
from tests.console.test_auth import PASSWORD, ROOT
from tests.kafka_helpers import wait_for
from tests.processes import kmq_argv


def test_backoff_doubles_after_the_free_failures_and_is_capped() -> None:
    throttle = LoginThrottle()
    keys = [user_key("olivia"), client_key("10.0.0.9")]
    # given: the free failures, then one more at a time
    locks = [throttle.failed(keys, 0) for _ in range(FREE_FAILURES + 12)]

    assert locks[:FREE_FAILURES] == [0] * FREE_FAILURES
    assert locks[FREE_FAILURES : FREE_FAILURES + 3] == [FIRST_LOCK_MS, 2 * FIRST_LOCK_MS,
                                                         4 * FIRST_LOCK_MS]  # fmt: skip
    assert locks[-1] == MAX_LOCK_MS
    assert throttle.wait_ms([client_key("10.0.0.9")], 1_000) == MAX_LOCK_MS - 1_000
    assert throttle.wait_ms([user_key("other"), client_key("10.0.0.1")], 1_000) == 0


def test_the_throttle_remembers_a_bounded_number_of_keys() -> None:
    throttle = LoginThrottle(max_keys=100)
    for n in range(1_000):
        throttle.failed([user_key(f"made-up-{n}")], n)

    assert throttle.failures(user_key("made-up-999")) == 1
    assert throttle.failures(user_key("made-up-0")) == 0


def test_failed_logins_are_throttled_before_hashing_logged_and_audited(
    console_env: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    users = UsersFile(console_env)
    users.add(ROOT, "olivia", OPERATOR, PASSWORD)
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    caplog.set_level(logging.WARNING)

    for _ in range(FREE_FAILURES + 1):
        assert log_in(users, "olivia", "wrong guess!", "10.0.0.9", store) is None
    with pytest.raises(LoginThrottledError, match="try again in"):
        log_in(users, "olivia", PASSWORD, "10.0.0.9", store)  # right, but locked
    with pytest.raises(LoginThrottledError):
        log_in(users, "somebody", "x", "10.0.0.9", store)  # the client is locked too
    assert log_in(users, "victor", "x" * 12, "10.0.0.7", store) is None  # others are not

    failed = [a for a in store.actions() if a.kind == LOGIN_FAILED]
    assert [a.actor for a in failed] == ["olivia from 10.0.0.9"] * (FREE_FAILURES + 1) + [
        "victor from 10.0.0.7"]  # fmt: skip
    assert "locked for 1 s" in failed[FREE_FAILURES].outcome
    assert sum("failed login: 'olivia' from 10.0.0.9" in r.message for r in caplog.records) == 4
    assert any("login throttled" in r.message for r in caplog.records)
    store.close()


def test_thirty_concurrent_logins_hash_at_most_two_at_once_with_real_argon2(
    console_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    users = UsersFile(console_env)
    users.add(ROOT, "olivia", OPERATOR, PASSWORD)
    real = auth._hasher
    running = [0, 0]  # now, most at once
    lock = threading.Lock()

    class Counting:
        def verify(self, stored: str, password: str) -> Any:
            with lock:
                running[0] += 1
                running[1] = max(running)
            try:
                return real.verify(stored, password)
            finally:
                with lock:
                    running[0] -= 1

        def hash(self, password: str) -> str:
            return str(real.hash(password))

    monkeypatch.setattr(auth, "_hasher", Counting())
    outcomes: list[str] = []

    def attempt(n: int) -> None:
        try:
            found = users.authenticate("olivia" if n % 2 else f"nobody-{n}", PASSWORD)
            outcomes.append("ok" if found else "refused")
        except LoginBusyError:
            outcomes.append("busy")

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert len(outcomes) == 30 and set(outcomes) <= {"ok", "refused", "busy"}
    assert auth.MAX_CONCURRENT_HASHES <= 4 and 1 <= running[1] <= auth.MAX_CONCURRENT_HASHES


def test_a_demoted_user_loses_their_controls_and_a_removed_one_is_logged_out_at_once(
    console_env: Path, private_audit_store: str
) -> None:
    app = open_app(Principal("olivia", OPERATOR), page="dead letters")
    assert not has_button(app, "Your role") and "olivia\nrole: operator" in texts(app)

    enroll(Principal("olivia", VIEWER))
    app.run()
    assert "olivia\nrole: viewer" in texts(app)
    assert "replay and discard need the operator role" in texts(app)

    console_env.write_text('{"users": {}}')
    app.run()
    assert [t.value for t in app.title] == ["kmq console"]
    assert "olivia is no longer a user of this console." in texts(app)


def test_an_idle_session_has_to_log_in_again(
    console_env: Path, private_audit_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(IDLE_TIMEOUT_ENV, "60")
    app = open_app(Principal("olivia", OPERATOR))
    assert [t.value for t in app.title] == ["Overview"]

    app.session_state[ACTIVITY_KEY] = Activity(time.monotonic() - 61)
    app.run()

    assert [t.value for t in app.title] == ["kmq console"]
    assert "idle for more than 60 s" in texts(app)


def test_a_locked_out_login_page_says_when_to_try_again(console_env: Path) -> None:
    UsersFile(console_env).add(ROOT, "olivia", OPERATOR, PASSWORD)
    app = AppTest.from_file(str(APP), default_timeout=60).run()
    for _ in range(FREE_FAILURES + 2):
        app.text_input[0].input("olivia")
        app.text_input[1].input("wrong password!")
        app.button[0].click().run()

    assert "too many failed logins: try again in" in texts(app)


def test_concurrent_add_users_wait_for_the_lock_and_keep_every_user_in_a_0600_file(
    tmp_path: Path,
) -> None:
    users_file = tmp_path / "kmq" / "users.json"
    users_file.parent.mkdir()
    env = {**os.environ, "KMQ_CONSOLE_USERS_FILE": str(users_file), "HOME": str(tmp_path)}
    names = [f"user-{n}" for n in range(4)]
    # given: the writers' lock held here, so that all four reach it and queue on it at once
    held = os.open(users_file.with_name("users.json.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    processes = [
        subprocess.Popen(
            kmq_argv("console", "add-user", name, "--role", "viewer", "--password-stdin"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for name in names
    ]
    try:
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(f"{PASSWORD}\n".encode())
            process.stdin.close()
        assert wait_for(lambda: all(_waits_for_a_lock(p.pid) for p in processes), timeout_s=120)
        assert not users_file.exists()
    finally:
        os.close(held)  # when: released, they write one after another
    for process in processes:
        assert process.wait(timeout=120) == 0, process.stderr.read() if process.stderr else ""

    assert sorted(UsersFile(users_file).entries()) == names
    assert stat.S_IMODE(users_file.stat().st_mode) == 0o600


def _waits_for_a_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked in ``flock`` (its kernel wait channel says so)."""
    try:
        return "lock" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
