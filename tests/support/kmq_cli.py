"""``kmq`` run in-process, as a test drives it: exit code checked, output captured."""

from __future__ import annotations

import pytest

from kmq_dagster.cli import main


class KmqCli:
    """Runs ``kmq`` commands in this process (``main([...])``) and reads what they print.

    Each call checks the exit code a user would see, so a test that expects a clean run or
    one error line fails, naming the command and its stderr, when the command behaves otherwise.
    """

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    def ok(self, *argv: str) -> str:
        """Run ``kmq *argv``, assert it exits 0 and return what it printed on stdout."""
        code = main(list(argv))
        out, err = self._capsys.readouterr()
        assert code == 0, f"kmq {' '.join(argv)} exited {code}: {err}"
        return out

    def fails(self, *argv: str) -> str:
        """Run ``kmq *argv``, assert it exits 1 (an error) and return what it printed on stderr."""
        code = main(list(argv))
        _, err = self._capsys.readouterr()
        assert code == 1, f"kmq {' '.join(argv)} exited {code}, not 1: {err}"
        return err

    def output(self, *argv: str) -> tuple[str, str]:
        """Run ``kmq *argv``, assert it exits 0 and return its stdout and stderr."""
        code = main(list(argv))
        out, err = self._capsys.readouterr()
        assert code == 0, f"kmq {' '.join(argv)} exited {code}: {err}"
        return out, err
