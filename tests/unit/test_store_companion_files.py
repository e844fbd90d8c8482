"""SQLite deletes the store's WAL and shared-memory files when the last connection to it
closes, at any moment another process or thread chooses. Opening the store makes those files
private if they are there (a store another user's tool once opened may have left them
readable), so a companion that goes in the middle of that check must be no error: it once
failed a worker's store with "cannot open the audit store ...: No such file or directory"."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kmq_dagster.audit.database import engine_for


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_readable_wal_file_is_made_private_when_the_store_opens(tmp_path: Path) -> None:
    database = tmp_path / "audit.db"
    wal = tmp_path / "audit.db-wal"
    wal.touch()
    os.chmod(wal, 0o644)

    engine_for(f"sqlite:///{database}").dispose()

    assert mode(wal) == 0o600
    assert mode(database) == 0o600


def test_companion_files_that_are_not_there_are_not_created(tmp_path: Path) -> None:
    engine_for(f"sqlite:///{tmp_path / 'audit.db'}").dispose()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.db"]


def test_a_wal_file_sqlite_deletes_while_it_is_checked_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a store whose WAL file is still readable by others, and whose last connection
    # elsewhere closes (so SQLite deletes the WAL file) just as this process checks that file
    database = tmp_path / "audit.db"
    wal = tmp_path / "audit.db-wal"
    wal.touch()
    os.chmod(wal, 0o644)
    real_chmod = os.chmod

    def chmod_after_sqlite_closed(path: os.PathLike[str] | str, mode: int) -> None:
        if Path(path) == wal:
            wal.unlink()
        real_chmod(path, mode)

    monkeypatch.setattr(os, "chmod", chmod_after_sqlite_closed)

    # when the store opens, then it opens, and the WAL file is not brought back
    engine_for(f"sqlite:///{database}").dispose()
    assert not wal.exists()
