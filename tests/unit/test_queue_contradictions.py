"""A stored queue compared with given settings (``Queue.contradictions``): every setting of the
model is compared, each difference is one phrase in the queue's words, and what is not given
or not known never contradicts."""

from __future__ import annotations

import pytest

from kmq_dagster.core.queue import Queue
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.core.value_formats import ValueFormat

STORED = Queue("orders", "billing", partitions=4, retry_policy=RetryPolicy.fixed([2_000]))


def test_each_difference_is_one_phrase_with_both_values() -> None:
    found = STORED.contradictions(
        partitions=8,
        aux_partitions=None,
        retry_policy=RetryPolicy.fixed([2_000, 7_000]),
        visibility_timeout_ms=600_000,
        max_redeliveries=5,
        value_format=ValueFormat.JSON,
    )

    assert found == [
        "partitions 4 (given: 8)",
        "retry delays 2s (given: retry delays 2s,7s)",
        "visibility timeout 30s (given: 10m)",
        "max redeliveries 3 (given: 5)",
        "value format bytes (given: json)",
    ]


def test_equal_unknown_or_left_out_values_never_contradict() -> None:
    same = STORED.replace(retry_policy=STORED.retry_policy.with_non_retryable(["KeyError"]))

    assert STORED.contradictions() == []
    assert STORED.contradictions(max_redeliveries=3, key_format="bytes") == []
    assert STORED.contradictions(retry_policy=same.retry_policy) == []  # non_retryable aside
    assert STORED.replace(partitions=None).contradictions(partitions=8) == []


def test_a_name_that_is_no_setting_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="visibility_timeout"):
        STORED.contradictions(visibility_timeout=30_000)


def test_a_declared_queue_is_compared_on_every_setting_its_definition_fixes() -> None:
    # What provisioning and open_declared_queue compare: all but the name and partition counts.
    declared = STORED.replace(
        partitions=16,
        aux_partitions=2,
        visibility_timeout_ms=60_000,
        max_redeliveries=7,
        key_format=ValueFormat.JSON,
    )

    assert STORED.contradictions(**STORED.fixed_settings()) == []
    assert STORED.contradictions(**declared.fixed_settings()) == [
        "visibility timeout 30s (given: 1m)",
        "max redeliveries 3 (given: 7)",
        "key format bytes (given: json)",
    ]
