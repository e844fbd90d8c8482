"""What a tracker needs for a large backlog and for its gauges: overdue messages in bounded
chunks, earliest deadline first, and the deadline of the oldest open start marker.

Time is a plain number passed in; nothing here sleeps.
"""

from __future__ import annotations

from kmq_dagster.core.inflight import MessageRef, PartitionInflight
from kmq_dagster.core.markers import EndMarker, StartMarker

T = "orders"


def test_a_backlog_is_handed_out_in_chunks_of_at_most_the_limit_earliest_deadline_first() -> None:
    # given 1,000 open messages under two deadlines, the later marker written first
    state = PartitionInflight()
    state.record_start(0, StartMarker(T, 0, 500, 500, deadline_ms=2_000))
    state.record_start(1, StartMarker(T, 0, 0, 500, deadline_ms=1_000))
    # when asked for at most 300
    chunk = state.overdue(5_000, limit=300)
    # then it gets 300, from the earlier deadline
    assert chunk == [MessageRef(T, 0, offset) for offset in range(300)]
    # and once those are ended, the next chunk goes on where it stopped
    state.record_end(EndMarker(T, 0, 0, 300))
    assert state.overdue(5_000, limit=300)[0] == MessageRef(T, 0, 300)
    assert len(state.overdue(5_000)) == 700


def test_the_oldest_open_deadline_follows_the_oldest_marker_with_an_open_message() -> None:
    state = PartitionInflight()
    assert state.oldest_open_deadline_ms() is None
    state.record_start(0, StartMarker(T, 0, 0, 2, deadline_ms=1_000))
    state.record_start(1, StartMarker(T, 0, 2, 2, deadline_ms=3_000))
    assert state.oldest_open_deadline_ms() == 1_000
    # when the oldest batch is acknowledged, the next one is the oldest
    state.record_end(EndMarker(T, 0, 0, 2))
    assert state.oldest_open_deadline_ms() == 3_000
    state.record_end(EndMarker(T, 0, 2, 2))
    assert state.oldest_open_deadline_ms() is None
