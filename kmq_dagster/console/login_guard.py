"""What stands between a password guesser and the users file: throttling with backoff per user
name and per client (see :mod:`kmq_dagster.core.login_throttle`), bounded hashing (see
:func:`kmq_dagster.console.auth.hashing_slot`), and a record of every failed login, logged
and audited.

A failed login is written to the audit store as an action of kind ``login-failed`` (actor: the
name tried and the client), through the store's own ``record_action``; a failure to audit is
logged and never turns a refusal into a success.
"""

from __future__ import annotations

import logging
import threading
import time

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.console.auth import LoginBusyError, Principal, UsersFile
from kmq_dagster.core.login_throttle import LoginThrottle, client_key, user_key
from kmq_dagster.errors import KmqError

LOGIN_FAILED = "login-failed"
#: Longest user name recorded as typed (the rest is cut).
MAX_LOGGED_NAME_CHARS = 100

_log = logging.getLogger(__name__)
_throttle = LoginThrottle()
_throttle_lock = threading.Lock()


class LoginThrottledError(KmqError):
    """Too many failed logins for this user or client: wait before trying again."""


def log_in(
    users: UsersFile, name: str, password: str, client: str, store: AuditStore | None
) -> Principal | None:
    """The principal ``name`` and ``password`` log in as, or ``None`` (a failure, counted,
    logged and audited).

    Raises:
        LoginThrottledError: the user name or the client must wait (nothing was hashed).
        LoginBusyError: every hashing slot stayed busy (nothing was checked).
    """
    keys = [user_key(name), client_key(client)]
    with _throttle_lock:
        wait_ms = _throttle.wait_ms(keys, _now_ms())
    if wait_ms > 0:
        _log.warning("login throttled: %r from %s (%d ms to wait)", _shown(name), client, wait_ms)
        raise LoginThrottledError(
            f"too many failed logins: try again in {max(1, round(wait_ms / 1000))} s"
        )
    try:
        principal = users.authenticate(name, password)
    except LoginBusyError:
        _log.warning("login refused, hashing busy: %r from %s", _shown(name), client)
        raise
    with _throttle_lock:
        if principal is not None:
            _throttle.succeeded(user_key(name))
            return principal
        lock_ms = _throttle.failed(keys, _now_ms())
        failures = _throttle.failures(user_key(name))
    _log.warning("failed login: %r from %s (failure %d of this name)", _shown(name), client,
                 failures)  # fmt: skip
    _audit(store, name, client, failures, lock_ms)
    return None


def _audit(store: AuditStore | None, name: str, client: str, failures: int, lock_ms: int) -> None:
    if store is None:
        return
    outcome = f"wrong user name or password (failure {failures} of this name)"
    if lock_ms:
        outcome += f"; locked for {lock_ms // 1000} s"
    try:
        store.record_action(
            kind=LOGIN_FAILED, actor=f"{_shown(name)} from {client}"[:255], queue_topic="*",
            group_id="*", selection="console login", count=1, target=None, dry_run=False,
            outcome=outcome,
        )  # fmt: skip
    except Exception:  # auditing must not change the answer; it is logged above already
        _log.warning("could not audit a failed login", exc_info=True)


def reset_throttle() -> None:
    """Forget every failure (tests, and an operator restarting the console)."""
    with _throttle_lock:
        _throttle.clear()


def _shown(name: str) -> str:
    return name[:MAX_LOGGED_NAME_CHARS]


def _now_ms() -> int:
    return int(time.time() * 1000)
