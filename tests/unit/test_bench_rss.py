"""The figures of ``kmq bench parallel --rss-backlog``: the peak is never below a sample."""

from __future__ import annotations

from kmq_dagster.bench.parallel_memory import RssFigures
from kmq_dagster.bench.parallel_runs import Drain


def test_the_peak_is_a_sample_above_the_kernels_high_water_mark() -> None:
    # Given: a drain whose first samples were above VmHWM read at its end (pages reclaimed
    # under memory pressure lower the RSS without raising the high-water mark)
    drain = Drain(seconds=3.0, handled=3000, acked=3000, cpu_s=1.0)
    samples = [(1.0, 73.7), (2.0, 73.6), (3.0, 73.4)]

    figures = RssFigures(3000, drain, samples, hwm_mb=73.5, idle_mb=60.0)

    # Then: the peak is the highest sample, and the start is never above it
    assert figures.peak_mb == 73.7
    assert figures.as_dict()["rss_start_mb"] <= figures.as_dict()["rss_peak_mb"]


def test_the_peak_is_the_high_water_mark_when_no_sample_caught_it() -> None:
    drain = Drain(seconds=2.0, handled=10, acked=10, cpu_s=0.1)

    figures = RssFigures(10, drain, [(1.0, 70.0), (2.0, 71.0)], hwm_mb=90.0, idle_mb=60.0)

    assert figures.peak_mb == 90.0
