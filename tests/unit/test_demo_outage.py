"""`kmq demo --ui`'s scripted outage ends after the breaker has opened, not at a fixed time: on
a busy machine the first orders may be processed minutes in, and an outage over before any of
them failed would show no breaker at all."""

from __future__ import annotations

from kmq_dagster.demo.ui import OutageScript

SCRIPT = OutageScript(after_s=20, for_s=20, give_up_s=600)


def test_the_service_is_up_before_the_outage_begins() -> None:
    assert not SCRIPT.is_down(19.9, None)


def test_it_stays_down_until_the_breaker_has_been_open_a_while() -> None:
    # given a busy machine: the breaker opens only 300 s in
    assert SCRIPT.is_down(20, None)
    assert SCRIPT.is_down(299, None)
    assert SCRIPT.is_down(319, 300)
    # then the service comes back 20 s after the opening (before the breaker first probes)
    assert not SCRIPT.is_down(320, 300)


def test_a_quick_breaker_gives_a_short_outage() -> None:
    assert SCRIPT.is_down(40, 33)
    assert not SCRIPT.is_down(53, 33)


def test_a_breaker_that_never_opens_ends_the_outage_after_the_give_up_time() -> None:
    assert SCRIPT.is_down(619, None)
    assert not SCRIPT.is_down(620, None)
