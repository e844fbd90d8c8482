"""Setting a :class:`threading.Event` from a signal handler without a deadlock.

Python runs a signal handler on the main thread between two of its bytecodes, wherever that
thread is. ``Event.set`` takes the event's lock, which is not reentrant. So a handler that sets
the event itself hangs the process for good whenever the main thread already holds that lock:

* a second Ctrl-C (or SIGTERM) arriving while the first one's handler is inside ``set``: the
  second handler runs inside the first and waits for the lock its own thread holds;
* a signal arriving while the main thread is inside ``Event.wait`` or ``Event.set`` on it (it
  holds the lock on entry and while it wakes).

Every other thread waiting on the event then waits for that lock too: a worker's
``--drain-timeout`` thread, which was to end the process, hung with it (CI, stop 60). Only
SIGKILL ended such a process.

:func:`set_soon` takes no lock: it puts the event on a :class:`queue.SimpleQueue`, whose
``put`` may interrupt itself on one thread (it is reentrant, written in C), and a daemon thread
sets it a moment later. :func:`prepare` starts that thread; call it before the handler is
installed, since starting a thread takes locks a handler must not.
"""

from __future__ import annotations

import os
import queue
import threading

#: Events a handler asked to set, in order; the setter thread takes them.
_to_set: queue.SimpleQueue[threading.Event] = queue.SimpleQueue()
#: The process whose setter thread runs (a forked child has none until it prepares).
_setter_pids: set[int] = set()
_starting = threading.Lock()


def prepare() -> None:
    """Start this process's setter thread, unless it runs already (outside signal handlers)."""
    with _starting:
        if os.getpid() in _setter_pids:
            return
        threading.Thread(target=_set_each, name="kmq-signal-setter", daemon=True).start()
        _setter_pids.add(os.getpid())


def set_soon(event: threading.Event) -> None:
    """Set ``event`` on the setter thread a moment from now; safe inside a signal handler.

    Without a setter thread in this process (:func:`prepare` was not called here), the event
    is set at once, as a handler would."""
    if os.getpid() not in _setter_pids:
        event.set()
        return
    _to_set.put(event)


def _set_each() -> None:
    while True:
        _to_set.get().set()
