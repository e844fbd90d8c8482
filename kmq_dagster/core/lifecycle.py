"""Services used as context managers: ``with`` starts one, and stops it however the start or
the body ends (a start that fails half-way must not leave a child process or a scratch folder
behind)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Service:
    """Subclasses say how to :meth:`start` and :meth:`stop`; ``stop`` must be safe to call on
    a service that started only in part, and twice."""

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
