"""The alarm the worker loop looks at once a message instead of reading the clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from kmq_dagster.kafka.clients import wall_clock_ms
from kmq_dagster.worker.deadline_alarm import DeadlineAlarm, EveryMessage, alarm_for
from tests.unit.fakes import FakeClock

LIMIT_S = 10.0  # how long a ring may take on a loaded machine


def wait_until(condition: Callable[[], object]) -> float:
    """Seconds until ``condition`` held (fails after ``LIMIT_S``)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < LIMIT_S, "the alarm never rang"
        time.sleep(0.001)
    return time.monotonic() - started


@pytest.fixture
def alarm() -> Iterator[DeadlineAlarm]:
    alarm = DeadlineAlarm(thread_name="test-alarm")
    yield alarm
    alarm.close()


def test_an_alarm_rings_once_its_deadline_passed_never_before(alarm: DeadlineAlarm) -> None:
    # given an alarm armed 200 ms ahead
    armed_at = time.monotonic()
    alarm.arm(200)

    # when it rings
    wait_until(lambda: alarm.rung)

    # then its deadline had passed
    assert time.monotonic() - armed_at >= 0.2


def test_an_alarm_armed_far_ahead_has_not_rung(alarm: DeadlineAlarm) -> None:
    # given an alarm that rang, armed again an hour ahead
    alarm.arm(0)
    wait_until(lambda: alarm.rung)
    alarm.arm(3_600_000)

    # then arming cleared the ring, and none comes while a sooner deadline would have rung
    sooner = DeadlineAlarm(thread_name="test-alarm-sooner")
    try:
        sooner.arm(50)
        wait_until(lambda: sooner.rung)
    finally:
        sooner.close()
    assert not alarm.rung


def test_a_sooner_deadline_rings_at_its_time_not_at_the_earlier_later_one(
    alarm: DeadlineAlarm,
) -> None:
    # given an alarm armed an hour ahead, then armed again 50 ms ahead
    alarm.arm(3_600_000)
    alarm.arm(50)

    # then it rings (within the limit, not in an hour)
    wait_until(lambda: alarm.rung)


def test_closing_an_alarm_ends_its_thread() -> None:
    alarm = DeadlineAlarm(thread_name="test-alarm-closed")
    alarm.arm(3_600_000)

    alarm.close()

    assert not alarm._thread.is_alive()


def test_the_real_clock_gets_an_alarm_and_a_fake_clock_a_look_after_every_call() -> None:
    real = alarm_for(wall_clock_ms, thread_name="test-alarm-real")
    try:
        assert isinstance(real, DeadlineAlarm)
    finally:
        real.close()
    fake = alarm_for(FakeClock(), thread_name="unused")
    assert isinstance(fake, EveryMessage) and fake.rung
    fake.arm(3_600_000)
    assert fake.rung
