"""Audit before effect (invariant 8): an operator action's row is written ``running`` before its
first effect, kept alive by a heartbeat, and finished with its counts however it ends.

A process that dies without finishing (SIGKILL, power loss) leaves a ``running`` row whose
heartbeat stops: the next look at the store (the console, the next action) finds its owner gone
and writes it ``interrupted``, with what it had done by then.

Actions on overlapping dead letters (same queue and group; ``*`` overlaps everything) run one
at a time: each holds a lease in the store while it runs, and a lease is free as soon as its
action is no longer running or its owner is gone. No operating-system lock is involved, so
this holds across hosts on PostgreSQL as on SQLite.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.orm import Session

from kmq_dagster.audit.models import ACTION_STATES, Action, ActionLease, DeadLetterEvent, as_utc
from kmq_dagster.core.wording import counted
from kmq_dagster.errors import AuditStoreError
from kmq_dagster.secrets import mask_text

log = logging.getLogger(__name__)


class AuditStore(Protocol):
    """What an action needs of the audit store (:class:`kmq_dagster.audit.store.AuditStore`,
    which records actions through this module: named here, not imported, so the two do not
    import each other)."""

    engine: Engine

    def session(self) -> Session: ...

    def writing(self, what: str) -> AbstractContextManager[None]: ...


RUNNING, SUCCEEDED, FAILED, STOPPED, INTERRUPTED = ACTION_STATES
#: How often a running action renews its heartbeat.
HEARTBEAT_S = 5.0
#: A running action whose heartbeat is older than this is taken for dead.
LEASE_TTL_S = 30.0
#: How often an action waiting for a lease looks again.
LEASE_POLL_S = 0.5
#: Wildcard queue or group: overlaps every queue or group.
ANY = "*"
#: The guard row every lease acquisition updates first (see ``ActionLease``).
_GUARD_ID = 0
#: Ids of the actions this process runs (started, not finished).
_RUNNING_HERE: set[int] = set()


def this_owner() -> str:
    """``host:pid`` of this process: who runs the actions it starts."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_is_gone(
    owner: str | None, expires_at: datetime | None, now: datetime, action_id: int | None = None
) -> bool:
    """Whether a running action's process is gone: its heartbeat expired, or it ran on this host
    and its process id no longer exists (found at once after a SIGKILL), or is this process's
    while the action is not one this process runs (a restarted container reusing the id)."""
    if expires_at is None or as_utc(expires_at) < now:
        return True
    host, _, pid = (owner or "").rpartition(":")
    if host == socket.gethostname() and pid == str(os.getpid()) and action_id is not None:
        return action_id not in _RUNNING_HERE
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # another user's live process
            return False
    return False


def overlaps(first: tuple[str, str], second: tuple[str, str]) -> bool:
    """Whether two (queue, group) scopes can select the same dead letters."""
    return all(a == b or ANY in (a, b) for a, b in zip(first, second, strict=True))


class ActionRecord:
    """One running action: its row, heartbeat and lease. Finish it exactly once."""

    def __init__(self, store: AuditStore, action_id: int, scope: tuple[str, str]) -> None:
        self.store = store
        self.id = action_id
        self.scope = scope
        _RUNNING_HERE.add(action_id)
        self._stopped = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat, name=f"kmq-action-{action_id}", daemon=True
        )
        self._heartbeat.start()

    def _beat(self) -> None:
        failing = False
        while not self._stopped.wait(HEARTBEAT_S):
            try:
                with self.store.engine.begin() as connection:
                    connection.execute(
                        update(Action)
                        .where(Action.id == self.id, Action.state == RUNNING)
                        .values(expires_at=_expiry())
                    )
            except Exception as exc:  # the action goes on; a later heartbeat may get through
                # One line when the store starts refusing (a full disk): a traceback every
                # few seconds would bury the command's own output and its error line.
                log.debug("heartbeat of action %d failed", self.id, exc_info=True)
                if not failing:
                    log.warning(
                        "the audit store refused the heartbeat of action %d (the action goes "
                        "on): %s", self.id, first_line(exc),
                    )  # fmt: skip
                failing = True
            else:
                failing = False

    def acquire(
        self, stop: threading.Event | None = None, on_wait: Callable[[Action], None] | None = None
    ) -> bool:
        """Wait until no other running action holds an overlapping lease, then hold one.

        Returns:
            ``True`` once held; ``False`` if ``stop`` was set while waiting.
        """
        waited = False
        while True:
            with self.store.writing("take the action's lease"):
                blocker = self._try_acquire()
            if blocker is None:
                return True
            if on_wait is not None and not waited:
                on_wait(blocker)
            waited = True
            if stop is not None and stop.wait(LEASE_POLL_S):
                return False
            if stop is None:
                time.sleep(LEASE_POLL_S)

    def _try_acquire(self) -> Action | None:
        now = _now()
        with self.store.engine.begin() as connection:
            # The guard row first: the write lock (SQLite) or row lock (PostgreSQL) it takes
            # makes the look-then-insert below atomic among acquirers.
            guard = update(ActionLease).where(ActionLease.action_id == _GUARD_ID)
            connection.execute(guard.values(acquired_at=now))
            reap_abandoned(connection, now)
            held = connection.execute(
                select(ActionLease.queue_topic, ActionLease.group_id, ActionLease.action_id)
                .join(Action, Action.id == ActionLease.action_id)
                .where(ActionLease.action_id != self.id, Action.state == RUNNING)
            ).all()
            for queue_topic, group_id, holder in held:
                if overlaps((queue_topic, group_id), self.scope):
                    blocker = connection.execute(select(Action).where(Action.id == holder)).one()
                    return _action_of(blocker)
            connection.execute(delete(ActionLease).where(ActionLease.action_id == self.id))
            connection.execute(
                insert(ActionLease),
                [{"action_id": self.id, "queue_topic": self.scope[0],
                  "group_id": self.scope[1], "acquired_at": now}],
            )  # fmt: skip
        return None

    def previous_run(self) -> Action | None:
        """The last earlier action of the same kind, queue and selection (the same replay run
        before), if any: a caller tells the operator when it was interrupted."""
        with self.store.session() as session:
            mine = session.get(Action, self.id)
            if mine is None:
                return None
            return session.scalars(
                select(Action)
                .where(
                    Action.id < self.id, Action.kind == mine.kind,
                    Action.queue_topic == mine.queue_topic, Action.group_id == mine.group_id,
                    Action.selection == mine.selection, Action.dry_run == mine.dry_run,
                )
                .order_by(Action.id.desc())
                .limit(1)
            ).first()  # fmt: skip

    def progress(self, count: int, outcome: str, connection: Connection | None = None) -> None:
        """Write what the action has done so far (in ``connection``'s transaction if given)."""
        statement = update(Action).where(Action.id == self.id).values(count=count, outcome=outcome)
        if connection is not None:
            connection.execute(statement)
            return
        with self.store.writing("record the action's progress"), self.store.engine.begin() as own:
            own.execute(statement)

    def fail(self, outcome: str, *, count: int, state: str = FAILED) -> str:
        """Finish as failed (or ``state``) if the store still takes writes.

        Returns:
            ``""``, or a note for the error the caller raises when the store refused this
            write too (the row then reads ``interrupted`` once this process has exited).
        """
        try:
            self.finish(state, count, outcome)
        except AuditStoreError:
            # The caller's error line carries the note: a traceback before it would bury it.
            log.debug("could not record the end of action %d", self.id, exc_info=True)
            return (
                f"; the action (#{self.id}) could not be written as ended either: it reads as "
                "interrupted once this process has exited"
            )
        return ""

    def finish(self, state: str, count: int, outcome: str, *, target: str | None = None) -> None:
        """Write how the action ended (and its ``target``, if only known now); release its lease.

        Raises:
            AuditStoreError: the store refused the write (the row stays ``running`` and reads
                as ``interrupted`` once this process is gone).
        """
        self._stopped.set()
        _RUNNING_HERE.discard(self.id)
        values = {"state": state, "count": count, "outcome": outcome,
                  "finished_at": _now(), "expires_at": None}  # fmt: skip
        if target is not None:
            values["target"] = target
        ending = self.store.writing("record how the action ended")
        with ending, self.store.engine.begin() as connection:
            connection.execute(update(Action).where(Action.id == self.id).values(**values))
            connection.execute(
                update(DeadLetterEvent)
                .where(DeadLetterEvent.action_id == self.id, DeadLetterEvent.state == "sending")
                .values(state="unconfirmed")
            )
            connection.execute(delete(ActionLease).where(ActionLease.action_id == self.id))


def start_action(
    store: AuditStore,
    *,
    kind: str,
    actor: str,
    queue_topic: str,
    group_id: str,
    selection: str,
    target: str | None,
    dry_run: bool,
) -> ActionRecord:
    """Write a ``running`` action (before the action's first effect) and start its heartbeat.

    Raises:
        AuditStoreError: the store refused the write: the action must not start.
    """
    row = {"kind": kind, "actor": actor, "at": _now(), "queue_topic": queue_topic,
           "group_id": group_id, "selection": selection, "count": 0, "target": target,
           "dry_run": dry_run, "outcome": "running", "state": RUNNING, "owner": this_owner(),
           "expires_at": _expiry()}  # fmt: skip
    starting = store.writing(f"record the start of the {kind}, so it did not start")
    with starting, store.engine.begin() as connection:
        action_id = connection.execute(insert(Action).returning(Action.id), [row]).scalar_one()
    return ActionRecord(store, int(action_id), (queue_topic, group_id))


def uses_of_replay_id(
    store: AuditStore, *, queue_topic: str, group_id: str, replay_id: str
) -> list[Action]:
    """The replays (not dry runs) of a queue's group recorded under ``replay_id`` (their
    selection ends with ``(replay id ...)``), oldest first."""
    with store.session() as session:
        return list(
            session.scalars(
                select(Action)
                .where(
                    Action.kind == "replay", Action.queue_topic == queue_topic,
                    Action.group_id == group_id, Action.dry_run.is_(False),
                    Action.selection.endswith(f" (replay id {replay_id})", autoescape=True),
                )
                .order_by(Action.id)
            )
        )  # fmt: skip


def reap_abandoned(connection: Connection, now: datetime) -> int:
    """Write every running action whose owner is gone as ``interrupted`` (with what it did),
    its unacknowledged copies as ``unconfirmed``, and free its lease; returns how many."""
    running = connection.execute(
        select(Action.id, Action.owner, Action.expires_at, Action.outcome).where(
            Action.state == RUNNING
        )
    ).all()
    reaped = 0
    for action in running:
        if not owner_is_gone(action.owner, action.expires_at, now, action.id):
            continue
        unconfirmed = connection.execute(
            update(DeadLetterEvent)
            .where(DeadLetterEvent.action_id == action.id, DeadLetterEvent.state == "sending")
            .values(state="unconfirmed")
        ).rowcount
        note = (
            f"; {counted(unconfirmed, 'copy', 'copies')} may have been sent unconfirmed"
            if unconfirmed
            else ""
        )
        outcome = (
            f"interrupted: its process {action.owner} is gone; by then: {action.outcome}{note}"
        )
        connection.execute(
            update(Action)
            .where(Action.id == action.id, Action.state == RUNNING)
            .values(state=INTERRUPTED, outcome=outcome, finished_at=now, expires_at=None)
        )
        connection.execute(delete(ActionLease).where(ActionLease.action_id == action.id))
        reaped += 1
    return reaped


def _now() -> datetime:
    return datetime.now(UTC)


def _expiry() -> datetime:
    return _now() + timedelta(seconds=LEASE_TTL_S)


def _action_of(row: Any) -> Action:
    """An ``Action`` built from a Core row (what a waiting caller is told about)."""
    return Action(**{column.key: getattr(row, column.key) for column in Action.__table__.c})


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s text, masked (database errors append the statement)."""
    text = str(exc).strip().splitlines()
    return mask_text(text[0] if text else type(exc).__name__)
