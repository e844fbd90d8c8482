"""``kmq console`` as a real process: it refuses an unsafe or unusable setup in one line,
``add-user`` writes the users file, and the console serves from the installed package."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from kmq_dagster.broker.ports import free_port
from kmq_dagster.console.auth import OPERATOR, Principal, UsersFile
from tests.kafka_helpers import wait_for
from tests.processes import kmq_argv, pid_alive, run_kmq

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment with its own HOME (no ~/.streamlit/secrets.toml, no ~/.kmq users)."""
    return {"HOME": str(tmp_path), "KMQ_CONSOLE_USERS_FILE": str(tmp_path / "users.json")}


def test_no_auth_on_a_non_loopback_address_is_refused(home: dict[str, str]) -> None:
    result = run_kmq("console", "--no-auth", "--address", "0.0.0.0", env=home)

    assert result.returncode == 1
    assert result.stderr.startswith("kmq: error: --no-auth serves on a loopback address only")
    assert "Traceback" not in result.stderr


def test_a_console_nobody_could_log_in_to_is_refused(home: dict[str, str]) -> None:
    result = run_kmq("console", env=home)

    assert result.returncode == 1
    assert "nobody can log in" in result.stderr and "kmq console add-user" in result.stderr


def test_add_user_writes_a_user_who_can_log_in(home: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run(
        kmq_argv("console", "add-user", "olivia", "--role", "operator", "--password-stdin"),
        input="a long enough password\n", env={**os.environ, **home}, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert "olivia is a operator" in result.stdout
    users = UsersFile(tmp_path / "users.json")
    assert users.authenticate("olivia", "a long enough password") == Principal("olivia", OPERATOR)
    short = run_kmq("console", "add-user", "x", "--role", "viewer", "--oidc", "--role", "nope",
                    env=home)  # fmt: skip
    assert short.returncode == 1 and "--role: 'nope' is not one of" in short.stderr


def test_the_console_serves_from_the_package_and_stops_on_sigterm(
    home: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    log = (tmp_path / "console.log").open("w")
    process = subprocess.Popen(
        kmq_argv("console", "--no-auth", "--port", str(port)),
        env={**os.environ, **home}, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert wait_for(lambda: _get(f"http://127.0.0.1:{port}/_stcore/health") == "ok", 60), (
            tmp_path / "console.log"
        ).read_text()
        assert "<title>" in (_get(f"http://127.0.0.1:{port}/") or "")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) is not None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        log.close()
    assert not pid_alive(process.pid)
    assert "serving on http://127.0.0.1" in (tmp_path / "console.log").read_text()


@pytest.mark.slow
def test_the_wheel_ships_the_console_app_and_its_pages(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("kmq_dagster-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())

    for page in ("app.py", "views/overview.py", "views/dead_letters.py", "views/actions.py",
                 "views/breakers.py"):  # fmt: skip
        assert f"kmq_dagster/console/{page}" in names


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return None
