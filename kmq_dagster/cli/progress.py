"""Progress of long commands for people: one live line on a terminal, sparse lines otherwise.

Long commands (demo, replay, ingest, bench) show their progress here and their result on
stdout; the components' logs go to a log file (``-v`` shows them instead).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import TextIO

#: On a pipe or file, a progress line is written at most this often (the last one always).
PLAIN_INTERVAL_S = 2.0


def log_file_for(command: str) -> Path:
    """Where a long command writes its components' logs: ``~/.kmq/logs/<command>.log``."""
    return Path.home() / ".kmq" / "logs" / f"{command}.log"


class LiveLine:
    """Updates one line in place on a terminal; elsewhere prints a line every few seconds.

    Call :meth:`update` as often as you like, :meth:`note` for a line that must stay, and
    :meth:`done` at the end.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self._shown = ""
        self._last_at = 0.0
        self._pending = ""

    def update(self, text: str) -> None:
        """Show ``text`` as the current progress."""
        if self.live:
            width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
            self.stream.write("\r" + text[:width].ljust(len(self._shown)))
            self.stream.flush()
            self._shown = text[:width]
            return
        self._pending = text
        if time.monotonic() - self._last_at >= PLAIN_INTERVAL_S:
            self._flush_pending()

    def note(self, text: str) -> None:
        """A line that stays (a step finished, a warning)."""
        self._clear()
        self._flush_pending()
        self.stream.write(text + "\n")
        self.stream.flush()

    def done(self, *, flush: bool = True) -> None:
        """End the live line (the last progress stays visible); ``flush=False`` drops a line
        not shown yet (on a pipe), for a command stopped before it finished."""
        if self.live and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = ""
        if not flush:
            self._pending = ""
        self._flush_pending()

    def _clear(self) -> None:
        if self.live and self._shown:
            self.stream.write("\r" + " " * len(self._shown) + "\r")
            self._shown = ""

    def _flush_pending(self) -> None:
        if self._pending:
            self.stream.write(self._pending + "\n")
            self.stream.flush()
            self._pending = ""
        self._last_at = time.monotonic()
