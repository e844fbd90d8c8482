"""A DLQ replay's request and its report (pure): what to move, where and how fast; what was
found and done.

The replay itself, which reads the DLQ and writes the copies, is ``kmq_dagster.operations.replay``;
these types are what a caller (Python, CLI, Dagster job, console) builds and reads.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from kmq_dagster.core.dead_letter_formats import EACH_ORIGINAL_TOPIC, is_foreign
from kmq_dagster.core.naming import validate_topic_name
from kmq_dagster.core.queue import Queue
from kmq_dagster.core.replay import (
    DEFAULT_MAX_REPLAYS,
    TARGET_WORDS,
    TARGETS,
    TO_RETRY,
    ReplaySelection,
    default_replay_id,
)
from kmq_dagster.core.wording import counted
from kmq_dagster.errors import ConfigError


@dataclass(frozen=True)
class ReplayRequest:
    """One replay of a queue's dead letters: what to move, where, how fast."""

    selection: ReplaySelection = field(default_factory=ReplaySelection)
    target: str = TO_RETRY
    dry_run: bool = False
    #: Copies per second at most; ``None``: as fast as the broker takes them.
    rate_per_s: float | None = None
    max_replays: int = DEFAULT_MAX_REPLAYS
    replay_id: str | None = None
    #: A topic chosen for the copies, instead of where ``target`` sends them.
    to_topic: str | None = None

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError(
                f"the replay target must be one of {', '.join(TARGETS)}", setting="target"
            )
        if self.rate_per_s is not None and not 0 < self.rate_per_s < float("inf"):
            raise ConfigError("the replay rate must be a positive number", setting="rate_per_s")
        if self.max_replays < 1:
            raise ConfigError("max replays must be at least 1", setting="max_replays")
        if self.replay_id is not None and not self.replay_id.strip():
            raise ConfigError("a replay id must not be blank", setting="replay_id")
        if self.to_topic is not None:
            validate_topic_name(self.to_topic)

    def id_for(self, queue: Queue) -> str:
        """The replay's id: given, or derived from the queue, selection and target."""
        target = self.target if self.to_topic is None else f"topic {self.to_topic}"
        return self.replay_id or default_replay_id(queue.topic, queue.group, self.selection, target)


@dataclass
class ReplayReport:
    """What a replay found and did."""

    replay_id: str
    target: str
    dry_run: bool
    scanned: int = 0
    selected: int = 0
    replayed: int = 0
    #: Selected but already replayed ``max_replays`` times.
    over_limit: int = 0
    #: Selected but discarded by an operator in the audit store.
    discarded: int = 0
    #: Dead letters a killed earlier run may have replayed already, replayed again now.
    possible_duplicates: int = 0
    #: Selected but already copied by an earlier run of this replay (recorded in the audit
    #: store, so not sent again).
    already_replayed: int = 0
    #: Selected foreign dead letters whose headers name no original topic to send them back
    #: to: left in the DLQ (replay them to a chosen topic).
    no_original_topic: int = 0
    by_error_type: Counter[str] = field(default_factory=Counter)
    #: In a dry run: the first selected dead letters, one line each.
    listed: list[str] = field(default_factory=list)
    #: Stopped by its ``cancel`` event before reaching the end of the DLQ.
    cancelled: bool = False
    #: The last run of this same replay, when it was interrupted (a killed process): what
    #: the audit store says it had done.
    interrupted_before: str | None = None
    #: The topic chosen for the copies, if one was (``ReplayRequest.to_topic``).
    to_topic: str | None = None

    @property
    def movable(self) -> int:
        """Selected dead letters that are neither at the replay limit, discarded, nor
        replayed by this replay already."""
        return (
            self.selected
            - self.over_limit
            - self.discarded
            - self.already_replayed
            - self.no_original_topic
        )

    def summary(self) -> str:
        verb = "would replay" if self.dry_run else "replayed"
        count = self.movable if self.dry_run else self.replayed
        types = ", ".join(f"{name} {n}" for name, n in self.by_error_type.most_common())
        return (
            ("cancelled: " if self.cancelled else "")
            + f"{verb} {count} of {counted(self.scanned, 'dead letter')} "
            f"{TARGET_WORDS[self.target] if self.to_topic is None else 'to ' + self.to_topic} "
            f"(replay id {self.replay_id}); selected {self.selected}, skipped at the replay "
            f"limit {self.over_limit}, discarded {self.discarded}, "
            f"possible duplicates {self.possible_duplicates}"
            + (
                f", already replayed by this replay {self.already_replayed}"
                if self.already_replayed
                else ""
            )
            + (
                f", left for want of an original topic {self.no_original_topic}"
                if self.no_original_topic
                else ""
            )
            + (f"; by error type: {types}" if types else "")
        )


def target_topic(queue: Queue, request: ReplayRequest) -> str:
    """The topic a replay writes to: the group's redelivery topic (target ``retry``), or the
    queue topic (target ``original``).

    A copy back to the group goes to its redelivery topic, not to a retry topic: the breaker
    sensor and every failure count (``kmq status``, the Dagster observations, the console)
    read the retry topics' growth as handler failures, and an operator's replay is not one
    (invariant 12). The redelivery topic is the group's own (invariant 9), consumed at once
    like a due retry, and counted as work done, never as a failure; a replayed copy that fails
    again goes to its next retry topic like any failed message, and is counted then.

    A chosen ``request.to_topic`` wins. A foreign dead-letter topic has no group of ours to
    go back to: its ``original`` target is each dead letter's own original topic
    (:data:`~kmq_dagster.core.dead_letter_formats.EACH_ORIGINAL_TOPIC`).

    Raises:
        ConfigError: target ``retry`` for a foreign dead-letter topic.
    """
    if request.to_topic is not None:
        return request.to_topic
    if is_foreign(queue):
        if request.target == TO_RETRY:
            raise ConfigError(
                f"{queue} has no kmq group to retry in: replay it to the original topic or "
                "to a chosen topic",
                setting="target",
            )
        return EACH_ORIGINAL_TOPIC
    return queue.redelivery_topic if request.target == TO_RETRY else queue.topic


class StopRequest(threading.Event):
    """Asks a running action to stop after its current step, saying why (the reason goes into
    its audited outcome, e.g. ``SIGTERM``)."""

    reason = "cancelled"

    def request(self, reason: str) -> None:
        self.reason = reason
        self.set()


def stop_reason(stop: threading.Event | None) -> str:
    """Why ``stop`` was set: a :class:`StopRequest`'s reason, else ``cancelled``."""
    return stop.reason if isinstance(stop, StopRequest) else "cancelled"
