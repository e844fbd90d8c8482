"""The supervisor's stop deadline: a command's own deadline plus the grace to finish."""

from __future__ import annotations

import pytest

from kmq_dagster.cli.crash_guard import STOP_GRACE_ENV, stop_deadline_env
from kmq_dagster.crash_guard import STOP_DEADLINE_ENV
from kmq_dagster.errors import ConfigError


def test_a_worker_is_killed_30_s_after_its_drain_timeout_a_tracker_30_s_after_the_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(STOP_GRACE_ENV, raising=False)
    assert stop_deadline_env({"drain_timeout": 2.5, "topic": "t"}) == {STOP_DEADLINE_ENV: "32.5"}
    assert stop_deadline_env({"topic": "t", "group": "g"}) == {STOP_DEADLINE_ENV: "30"}


def test_the_grace_can_be_shortened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STOP_GRACE_ENV, "3")
    assert stop_deadline_env({"drain_timeout": 1.0}) == {STOP_DEADLINE_ENV: "4"}


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_a_grace_that_is_not_a_number_of_seconds_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(STOP_GRACE_ENV, value)
    with pytest.raises(ConfigError, match=f"{STOP_GRACE_ENV} must be a number of seconds >= 0"):
        stop_deadline_env({"drain_timeout": 1.0})
