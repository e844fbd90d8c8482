"""The audit store's files are private: ``~/.kmq`` is created ``0700`` and the SQLite store
``0600`` (its WAL and shared-memory files too), also in a folder that existed already: kmq's
home gets one warning if other users can read it, another folder (a project's, as the dg example
suggests) only if other users can write it, and no lock file is left beside the store. Run as
real ``kmq`` processes with their own HOME."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.processes import run_kmq


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def discard(home: Path, *extra: str, audit_url: str = "") -> str:
    """``kmq discard`` (it needs the store, not Kafka) with ``home`` as HOME; returns stderr."""
    env = {"HOME": str(home), "KMQ_AUDIT_URL": audit_url}
    result = run_kmq("discard", "--topic", "orders", "--group", "billing", *extra, env=env)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_a_new_kmq_home_is_0700_and_the_audit_store_0600(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)

    stderr = discard(tmp_path)

    home = tmp_path / ".kmq"
    assert mode(home) == 0o700
    store_files = [p for p in home.iterdir() if p.name.startswith("audit.db")]
    assert {p.name for p in store_files} >= {"audit.db"}
    assert {p.name: mode(p) for p in store_files} == {p.name: 0o600 for p in store_files}
    assert "readable by other users" not in stderr


def test_an_existing_shared_folder_gets_one_warning_and_a_private_store(tmp_path: Path) -> None:
    home = tmp_path / ".kmq"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    (home / "audit.db").touch()
    os.chmod(home / "audit.db", 0o644)

    stderr = discard(tmp_path)

    assert mode(home) == 0o755  # the operator's folder is left as it is, with a warning
    assert stderr.count(f"{home} is readable by other users (mode 755)") == 1, stderr
    assert "chmod 700" in stderr
    assert mode(home / "audit.db") == 0o600
    assert {mode(p) for p in home.iterdir() if p.name.startswith("audit.db")} == {0o600}


def test_a_project_folder_others_can_read_draws_no_warning_and_keeps_no_lock_file(
    tmp_path: Path,
) -> None:
    project = tmp_path / "kmq-orders"
    project.mkdir()
    os.chmod(project, 0o755)  # what `mkdir` gives under the usual umask 022

    stderr = discard(tmp_path, audit_url=f"sqlite:///{project}/audit.db")

    assert "other users" not in stderr, stderr
    assert mode(project / "audit.db") == 0o600
    assert sorted(p.name for p in project.iterdir()) == ["audit.db"]  # no migrate.lock left


def test_a_store_in_a_folder_others_can_write_gets_a_warning(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)

    stderr = discard(tmp_path, audit_url=f"sqlite:///{shared}/audit.db")

    assert stderr.count(f"{shared} is writable by other users (mode 777)") == 1, stderr
    assert mode(shared / "audit.db") == 0o600
