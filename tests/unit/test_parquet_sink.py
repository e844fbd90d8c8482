"""The Parquet sink: tasks stage files that readers do not see; the driver's commit makes them
part of the dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from kmq_dagster.errors import ConfigError
from kmq_dagster.spark.sink import OUTPUT_COLUMNS, ParquetSink, StagedFile


def rows(first: int, count: int) -> list[Any]:
    offsets = list(range(first, first + count))
    return [["t"] * count, [0] * count, offsets, [None] * count, ["null"] * count, ["b"] * count]


def readable_offsets(path: Path) -> list[int]:
    table = ds.dataset(str(path), format="parquet").to_table() if path.exists() else None
    if table is None or "offset" not in table.column_names:  # no file but hidden ones
        return []
    return sorted(table["offset"].to_pylist())


def test_staged_rows_are_invisible_until_the_driver_commits_them(tmp_path: Path) -> None:
    output = tmp_path / "out"
    sink = ParquetSink(str(output))
    staged = StagedFile(sink, "b1", OUTPUT_COLUMNS)
    staged.append(rows(0, 3))
    staged.append(rows(3, 2))
    staged.close()
    assert staged.path is not None and staged.rows == 5

    assert readable_offsets(output) == []  # staged under _kmq_staging: readers skip it

    sink.commit([staged.path])
    sink.discard("b1")

    assert readable_offsets(output) == [0, 1, 2, 3, 4]
    assert not (output / "_kmq_staging" / "b1").exists()


def test_a_task_with_no_rows_stages_nothing(tmp_path: Path) -> None:
    staged = StagedFile(ParquetSink(str(tmp_path / "out")), "b1", OUTPUT_COLUMNS)
    staged.close()

    assert staged.path is None


def test_batches_append_files_side_by_side(tmp_path: Path) -> None:
    sink = ParquetSink(str(tmp_path / "out"))
    for batch_id, first in (("b1", 0), ("b2", 10)):
        staged = StagedFile(sink, batch_id, OUTPUT_COLUMNS)
        staged.append(rows(first, 2))
        staged.close()
        assert staged.path is not None
        sink.commit([staged.path])

    assert readable_offsets(tmp_path / "out") == [0, 1, 10, 11]


def test_an_output_pyarrow_cannot_open_is_a_clear_error_before_any_batch() -> None:
    with pytest.raises(ConfigError, match="cannot write the output nosuch://bucket/x"):
        ParquetSink("nosuch://bucket/x")


def test_spark_reads_staged_files_under_the_output_s_own_scheme(tmp_path: Path) -> None:
    sink = ParquetSink(f"file://{tmp_path}/out")
    staged = sink.staging_path("b1", "part-1.parquet")

    assert staged == f"{tmp_path}/out/_kmq_staging/b1/part-1.parquet"
    assert sink.spark_path(staged) == f"file://{tmp_path}/out/_kmq_staging/b1/part-1.parquet"
    assert ParquetSink(str(tmp_path / "out")).spark_path(staged) == staged


def test_the_rows_of_committed_files_are_counted_with_their_duplicates(tmp_path: Path) -> None:
    # given two batches whose files hold offsets 0-4 and 3-6 (3 and 4 twice: a redelivery),
    # and an earlier file that is not the run's
    sink = ParquetSink(str(tmp_path / "out"))
    committed: list[str] = []
    for batch_id, first, count in (("earlier", 100, 3), ("b1", 0, 5), ("b2", 3, 4)):
        staged = StagedFile(sink, batch_id, OUTPUT_COLUMNS)
        staged.append(rows(first, count))
        staged.close()
        assert staged.path is not None
        files = sink.commit([staged.path])
        if batch_id != "earlier":
            committed += files
    # then only the run's files count: 9 rows, 7 distinct messages
    assert sink.count_rows(committed, ("topic", "partition", "offset")) == (9, 7)
    assert sink.count_rows([], ("topic", "partition", "offset")) == (0, 0)
