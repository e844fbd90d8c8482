"""What the breaker sensor counts per tick: a sample of the group's finished messages and their
failures, with what does not count yet carried to the next tick.

A watcher sees no single handler call; it sees, per tick, how many messages the group finished
and how many of them failed in a way that is retried (copies to the retry topics; dead letters
are mostly bad input, which the workers' breaker ignores too, or retries already counted).
An operator's replay never writes to a retry topic: its copies go to the group's redelivery
topic and count as finished messages when processed, so a replay into a healthy group lowers
the error rate rather than raising it (invariant 12); a replayed copy that fails again is a
failure like any other.
:func:`~kmq_dagster.core.breaker.judge_samples` judges the samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from kmq_dagster.core.breaker import Sample


@dataclass(frozen=True)
class Unsettled:
    """What earlier ticks saw that does not count yet (kept between ticks)."""

    #: Zero or less: messages that went in flight without the group's offsets moving past
    #: them yet (a Spark batch under way), to be set against their commit.
    finished: int = 0
    #: Retry copies whose messages do not count as finished yet.
    failures: int = 0


def settle(
    at_ms: int, finished: int, failures: int, unsettled: Unsettled
) -> tuple[Sample, Unsettled]:
    """The sample of one tick (from :func:`~kmq_dagster.core.status.progress_between`), and
    what stays unsettled. A failure counts once its message counts as finished: a Spark batch
    writes its retry copies while its successes are in flight, and only its offset commit at
    the end finishes them, so a tick in mid-batch would see failures alone (the batch is not
    stopped any sooner by opening then: runs check the breaker between batches). A worker
    commits, then finishes each message, so its failures count at once."""
    finished += unsettled.finished
    failures += unsettled.failures
    counted = max(0, finished)
    counted_failures = min(failures, counted)
    return Sample(at_ms, counted, counted_failures), Unsettled(
        min(0, finished), failures - counted_failures
    )
