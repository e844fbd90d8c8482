"""What ``kmq demo --ui`` tells the person watching, besides its own script: the breaker's
transitions as the audit store records them ("breaker opened: ...", "breaker closed after 42s:
..."), and the alerts as a webhook receives them ("alert sent: [critical] ...").

The transitions come from the shared breaker's ``breaker_transitions`` rows, whoever wrote them
(the Dagster breaker sensor, or a worker with ``--breaker``), read once a second. The alerts come
from a loopback webhook the demo points ``KMQ_ALERT_WEBHOOK_URL`` at: the lines show exactly
what an on-call channel would get, after the alert sensor's folding and resolve rules.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kmq_dagster.audit.breaker_state import transition_event
from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.breaker import State
from kmq_dagster.core.breaker_alerts import TransitionEvent
from kmq_dagster.core.breaker_reports import describe_transition
from kmq_dagster.core.queue import Queue
from kmq_dagster.defs.alert_sinks import Alert

log = logging.getLogger(__name__)

#: Seconds between two reads of the stored transitions.
POLL_INTERVAL_S = 1.0


def new_transition_lines(
    transitions: list[TransitionEvent], last_seen_id: int
) -> tuple[list[str], int]:
    """Lines for the transitions after ``last_seen_id`` (oldest first), and the newest id."""
    fresh = [t for t in transitions if t.id > last_seen_id]
    lines = [f"breaker {describe_transition(t, transitions)}" for t in fresh]
    return lines, max([last_seen_id, *(t.id for t in fresh)])


def _stored_transitions(store: AuditStore, queue: Queue) -> list[TransitionEvent]:
    return [transition_event(row) for row in store.transitions(queue.topic, queue.group)]


def newest_transition_id(audit_url: str, queue: Queue) -> int:
    """The id of ``queue``'s newest stored transition (0: none): where a watch begins."""
    store = AuditStore(audit_url)
    try:
        return max((t.id for t in _stored_transitions(store, queue)), default=0)
    finally:
        store.close()


def watch_transitions(
    audit_url: str,
    queue: Queue,
    say: Callable[[str], None],
    stop: threading.Event,
    last_seen: int,
    *,
    opened: threading.Event | None = None,
) -> None:
    """Say each transition of ``queue``'s breaker after ``last_seen`` until ``stop`` is set;
    set ``opened`` once one of them opens the breaker."""
    store = AuditStore(audit_url)
    try:
        while not stop.wait(POLL_INTERVAL_S):
            try:
                transitions = _stored_transitions(store, queue)
                lines, seen_now = new_transition_lines(transitions, last_seen)
            except Exception:  # the watch only informs: an unreadable store must not end it
                log.warning("could not read the breaker transitions", exc_info=True)
                continue
            if opened is not None and any(
                t.id > last_seen and t.to_state is State.OPEN for t in transitions
            ):
                opened.set()
            last_seen = seen_now
            for line in lines:
                say(line)
    finally:
        store.close()


@contextmanager
def alert_receiver(say: Callable[[str], None]) -> Iterator[str]:
    """A webhook on a free loopback port that says each alert it receives; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                alert = Alert(**json.loads(body))
            except (ValueError, TypeError):
                self.send_response(400)
            else:
                say(f"alert sent: {alert.line()}")
                self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the demo's output is its lines, not an access log

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="demo-alerts", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def watching_breaker(
    audit_url: str, queue: Queue, say: Callable[[str], None]
) -> Iterator[threading.Event]:
    """Run :func:`watch_transitions` on a thread for the duration of the ``with`` block; a
    transition stored once the block has begun is told, one stored before it is not (the
    starting point is read here, not on the thread, which may start late). Yields an event
    set once the breaker has opened within the block."""
    stop = threading.Event()
    opened = threading.Event()
    last_seen = newest_transition_id(audit_url, queue)
    thread = threading.Thread(
        target=watch_transitions,
        args=(audit_url, queue, say, stop, last_seen),
        kwargs={"opened": opened},
        name="demo-breaker",
    )
    thread.start()
    try:
        yield opened
    finally:
        stop.set()
        thread.join(10)
