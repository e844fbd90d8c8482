"""A visibility timeout under a second is accepted with a warning, exactly below the line."""

from __future__ import annotations

from kmq_dagster.core.queue import Queue
from kmq_dagster.core.queue_settings import SHORT_VISIBILITY_TIMEOUT_MS, short_visibility_warning


def test_a_timeout_just_under_a_second_warns_and_one_of_a_second_does_not() -> None:
    assert SHORT_VISIBILITY_TIMEOUT_MS == 1_000
    warning = short_visibility_warning(999)

    assert warning is not None and warning.startswith("a visibility timeout of 999ms ")
    assert "may be redelivered" in warning
    assert short_visibility_warning(1_000) is None


def test_the_default_timeout_and_the_shortest_allowed_one_are_both_accepted() -> None:
    assert short_visibility_warning(Queue("t", "g").visibility_timeout_ms) is None
    assert Queue("t", "g", visibility_timeout_ms=1).visibility_timeout_ms == 1  # still valid
    assert short_visibility_warning(1) is not None
