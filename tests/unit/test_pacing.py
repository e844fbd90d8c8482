"""The replay's pacer: at most the rate, no burst after a slow start or a stall."""

from __future__ import annotations

import pytest

from kmq_dagster.core.pacing import Pacer
from tests.unit.fakes import FakeSecondsClock


def send_times(
    pacer: Pacer, clock: FakeSecondsClock, count: int, stall_before: dict[int, float]
) -> list[float]:
    """When each of ``count`` sends goes out, the caller sleeping what the pacer says (and
    ``stall_before[i]`` seconds of other work before send ``i``)."""
    times = []
    for index in range(count):
        clock.now_s += stall_before.get(index, 0.0)
        clock.now_s += pacer.wait_s()
        times.append(clock.now_s)
    return times


def most_in_any_window(times: list[float], window_s: float) -> int:
    return max(sum(1 for t in times if start <= t < start + window_s) for start in times)


def test_sends_are_one_interval_apart() -> None:
    clock = FakeSecondsClock(100.0)
    times = send_times(Pacer(4, clock_s=clock), clock, 9, {})
    assert times[-1] - times[0] == pytest.approx(2.0)
    assert most_in_any_window(times, 1.0) == 4


def test_a_slow_start_earns_no_burst() -> None:
    # the pacer made, then a second of reading before the first copy: the copies still go
    # out one interval apart (a budget from the start sent three at once here)
    clock = FakeSecondsClock(100.0)
    pacer = Pacer(4, clock_s=clock)
    clock.now_s += 1.0
    times = send_times(pacer, clock, 9, {})
    assert most_in_any_window(times, 1.0) == 4
    assert times[-1] - times[0] == pytest.approx(2.0)


def test_a_stall_mid_way_is_not_made_up() -> None:
    clock = FakeSecondsClock(100.0)
    times = send_times(Pacer(4, clock_s=clock), clock, 12, {4: 3.0})
    assert most_in_any_window(times, 1.0) == 4
    assert times[5] - times[4] == pytest.approx(0.25)  # after the stall: the interval again


def test_a_late_wake_up_does_not_slow_the_rate() -> None:
    clock = FakeSecondsClock(100.0)
    pacer = Pacer(100, clock_s=clock)
    times = []
    for _ in range(101):
        clock.now_s += pacer.wait_s() + 0.001  # every sleep wakes 1 ms late
        times.append(clock.now_s)
    # scheduled from when each send was due: 100 intervals of 10 ms, not of 11 ms
    assert times[-1] - times[0] == pytest.approx(1.0, abs=0.011)


@pytest.mark.parametrize("rate", [0, -1.0])
def test_a_rate_that_is_not_positive_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        Pacer(rate)
