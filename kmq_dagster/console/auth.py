"""Who may do what in the console: roles, the users file, and the checks the acting functions
make themselves (a hidden button is a convenience, never the protection).

Roles, each including the one before: ``viewer`` browses and exports (masked), ``operator``
also replays and discards, ``admin`` also adds users. The users file is JSON, written
``0600``: ``{"users": {"alice": {"role": "operator", "password_hash": "$argon2id$..."}}}``.
An entry without a password hash gives a role to an OIDC identity (matched by e-mail).

Hashing is bounded: argon2 takes 64 MiB per hash, so at most :data:`MAX_CONCURRENT_HASHES`
run at once in a process; a login that finds no free slot within :data:`HASH_WAIT_S` is
refused with :class:`LoginBusyError` instead of queueing memory. Writers of the users file
take an exclusive lock on a sidecar ``.lock`` file for the whole read-modify-write, so two
``kmq console add-user`` at once both keep their user.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from kmq_dagster.errors import ConfigError, KmqError, PermissionDeniedError

VIEWER, OPERATOR, ADMIN = "viewer", "operator", "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)
#: Shortest password ``add-user`` accepts.
MIN_PASSWORD_LENGTH = 10

#: Argon2 hashes computed at once in one process (64 MiB of memory each).
MAX_CONCURRENT_HASHES = 2
#: Seconds a login waits for a free hashing slot before it is refused.
HASH_WAIT_S = 5.0

_hasher = PasswordHasher()
_hash_slots = threading.BoundedSemaphore(MAX_CONCURRENT_HASHES)


class LoginBusyError(KmqError):
    """Every hashing slot stayed busy: the login was refused, not queued."""


@contextmanager
def hashing_slot(wait_s: float = HASH_WAIT_S) -> Iterator[None]:
    """Hold one of the :data:`MAX_CONCURRENT_HASHES` hashing slots.

    Raises:
        LoginBusyError: no slot came free within ``wait_s`` seconds.
    """
    if not _hash_slots.acquire(timeout=wait_s):
        raise LoginBusyError("too many logins at once: try again in a few seconds")
    try:
        yield
    finally:
        _hash_slots.release()


@functools.cache
def _dummy_hash() -> str:
    """Verified against when the user does not exist, so a wrong name takes as long as a
    wrong password and timing does not reveal which names exist (the caller holds a slot)."""
    return str(_hasher.hash("not a password of anyone"))


@dataclass(frozen=True)
class Principal:
    """The person acting: a name for the audit log and a role."""

    name: str
    role: str

    def __post_init__(self) -> None:
        check_role(self.role)

    def has(self, role: str) -> bool:
        """Whether this principal's role includes ``role``."""
        return ROLES.index(self.role) >= ROLES.index(check_role(role))


def check_role(role: str) -> str:
    """``role`` if it is a known role.

    Raises:
        ConfigError: not one of viewer, operator, admin.
    """
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def require_role(principal: Principal, role: str, action: str) -> None:
    """Refuse ``action`` unless ``principal`` has ``role``.

    Raises:
        PermissionDeniedError: the principal's role is below ``role``.
    """
    if not principal.has(role):
        raise PermissionDeniedError(
            f"{principal.name} is a {principal.role}: {action} needs the {role} role"
        )


class UsersFile:
    """The console's users: names, roles and argon2 password hashes, in one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> dict[str, dict[str, str]]:
        """Every user's entry (``role``, optional ``password_hash``); empty if no file.

        Raises:
            ConfigError: the file is not a users file.
        """
        if not self.path.exists():
            return {}
        try:
            users = json.loads(self.path.read_text())["users"]
            if not isinstance(users, dict):
                raise TypeError
            return {str(name): dict(entry) for name, entry in users.items()}
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{self.path} is not a kmq console users file") from None

    def add(self, by: Principal, name: str, role: str, password: str | None) -> None:
        """Add or replace user ``name`` (``password`` ``None``: an OIDC identity).

        Raises:
            PermissionDeniedError: ``by`` is not an admin.
            ConfigError: empty name, unknown role, or a password that is too short.
        """
        require_role(by, ADMIN, "adding a user")
        check_role(role)
        if not name.strip() or name != name.strip():
            raise ConfigError("a user name must be non-empty, without surrounding spaces")
        entry = {"role": role}
        if password is not None:
            if len(password) < MIN_PASSWORD_LENGTH:
                raise ConfigError(f"a password needs at least {MIN_PASSWORD_LENGTH} characters")
            with hashing_slot():
                entry["password_hash"] = _hasher.hash(password)
        with self._locked():
            users = self.entries()
            users[name] = entry
            self._write({"users": users})

    def authenticate(self, name: str, password: str) -> Principal | None:
        """The user ``name`` if ``password`` is theirs, else ``None``.

        Raises:
            LoginBusyError: every hashing slot stayed busy (nothing was checked).
        """
        entry = self.entries().get(name, {})
        stored = entry.get("password_hash")
        with hashing_slot():
            try:
                _hasher.verify(stored or _dummy_hash(), password)
            except (VerificationError, InvalidHashError):
                return None
        return Principal(name, entry["role"]) if stored else None

    def current(self, principal: Principal) -> Principal | None:
        """``principal`` as the file has them now (a password user): their current role, or
        ``None`` once they are removed, so a change takes effect on the next action."""
        entry = self.entries().get(principal.name)
        if not entry or not entry.get("password_hash"):
            return None
        return Principal(principal.name, check_role(entry.get("role", "")))

    def role_of(self, name: str) -> str | None:
        """The role the file gives ``name`` (an OIDC identity), if any."""
        entry = self.entries().get(name)
        return check_role(entry["role"]) if entry and "role" in entry else None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the exclusive lock writers of this file take (released when the process dies)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)

    def _write(self, content: dict[str, object]) -> None:
        """Replace the file atomically, readable by its owner only (the caller holds the lock)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".users-")
        try:
            with os.fdopen(handle, "w") as out:
                json.dump(content, out, indent=2, sort_keys=True)
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
