"""Which actions overlap, and when a running action's owner counts as gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from kmq_dagster.audit.actions import overlaps, owner_is_gone

NOW = datetime(2026, 11, 25, 6, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=20)


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        (("orders", "billing"), ("orders", "billing"), True),
        (("orders", "billing"), ("orders", "shipping"), False),
        (("orders", "billing"), ("payments", "billing"), False),
        (("orders", "*"), ("orders", "shipping"), True),
        (("*", "*"), ("payments", "billing"), True),
        (("orders", "*"), ("payments", "billing"), False),
    ],
)
def test_scopes_overlap_when_they_can_select_the_same_dead_letters(
    first: tuple[str, str], second: tuple[str, str], expected: bool
) -> None:
    assert overlaps(first, second) is expected
    assert overlaps(second, first) is expected


def test_an_owner_whose_heartbeat_expired_is_gone_wherever_it_ran() -> None:
    assert owner_is_gone("elsewhere:123", NOW - timedelta(seconds=1), NOW)
    assert owner_is_gone(None, None, NOW)
    assert not owner_is_gone("elsewhere:123", LATER, NOW)


def test_an_owner_on_this_host_is_gone_as_soon_as_its_process_is() -> None:
    # given a process that has exited (its id is free), and this live one
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    host = socket.gethostname()

    assert owner_is_gone(f"{host}:{ended.stdout.strip()}", LATER, NOW)
    assert not owner_is_gone(f"{host}:{os.getpid()}", LATER, NOW)


def test_this_process_id_on_this_host_is_gone_unless_the_action_runs_here() -> None:
    # a container restarted under the same host name can get its predecessor's process id
    me = f"{socket.gethostname()}:{os.getpid()}"

    assert owner_is_gone(me, LATER, NOW, action_id=-1)
    assert not owner_is_gone(me, LATER, NOW)
