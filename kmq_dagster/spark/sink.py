"""The Parquet dataset a job appends to: tasks stage files, the driver commits them.

Each task writes its part of a batch with pyarrow into the batch's staging directory,
``<output>/_kmq_staging/<batch id>/``, which readers skip (Spark and pyarrow ignore names
starting with ``_``). Once every task has finished, the driver commits the batch by moving the
staged files into ``<output>``; only then are the batch's messages acknowledged. The rows never
pass through the JVM or the driver.

A driver that dies halfway through a commit leaves some files committed and some staged: the
batch's messages were not acknowledged, so they come back and are written again (duplicates,
which the ``topic``, ``partition`` and ``offset`` columns identify; never losses). Staged files
of such a batch stay behind in ``_kmq_staging`` and may be deleted.
"""

from __future__ import annotations

import functools
import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs

from kmq_dagster.errors import ConfigError

#: The columns every row starts with: where its message was first produced, and its key.
_ORIGIN = [
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("key", pa.binary()),
]
#: Columns of the output: the origin, the function's result, the batch that wrote it.
OUTPUT_COLUMNS = pa.schema(
    [*_ORIGIN, pa.field("result", pa.string()), pa.field("batch_id", pa.string(), nullable=False)]
)
#: Columns a DataFrame transform gets: one row per message of the batch.
INPUT_COLUMNS = pa.schema(
    [
        *_ORIGIN,
        pa.field("value", pa.binary()),
        pa.field("timestamp_ms", pa.int64(), nullable=False),
        pa.field(
            "headers",
            pa.list_(pa.struct([pa.field("name", pa.string()), pa.field("value", pa.binary())])),
        ),
    ]
)
STAGING_DIR = "_kmq_staging"
#: Rows per Parquet row group of a staged file.
ROW_GROUP_ROWS = 100_000
#: Spark's names for filesystems that pyarrow knows by another name.
_SCHEMES = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class ParquetSink:
    """A Parquet dataset at ``path``: a local path or a URI pyarrow can open (``file://``,
    ``s3://`` (also as ``s3a://``), ``gs://``, ``hdfs://``).

    Raises:
        ConfigError: pyarrow cannot open ``path`` (on the driver, before any batch runs).
    """

    path: str

    def __post_init__(self) -> None:
        self.filesystem()  # a bad path fails here, not in the tasks

    def filesystem(self) -> tuple[fs.FileSystem, str]:
        """The filesystem and the dataset's path on it."""
        scheme, sep, rest = self.path.partition("://")
        uri = f"{_SCHEMES.get(scheme, scheme)}{sep}{rest}" if sep else os.path.abspath(self.path)
        try:
            return _open_filesystem(uri)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise ConfigError(f"cannot write the output {self.path}: {exc}") from None

    def staging_path(self, batch_id: str, name: str) -> str:
        """Where a task stages file ``name`` of batch ``batch_id`` (a path on the filesystem)."""
        return posixpath.join(self.filesystem()[1], STAGING_DIR, batch_id, name)

    def spark_path(self, staged: str) -> str:
        """``staged`` (a filesystem path) as Spark reads it: with the output's own scheme."""
        if "://" not in self.path:
            return staged
        root = self.filesystem()[1]
        return self.path.rstrip("/") + staged[len(root.rstrip("/")) :]

    def commit(self, staged: list[str]) -> list[str]:
        """Move staged files into the dataset (on the driver): the batch's write commits.
        Returns the files' paths in the dataset."""
        filesystem, root = self.filesystem()
        committed = []
        for path in staged:
            target = posixpath.join(root, posixpath.basename(path))
            filesystem.move(path, target)
            committed.append(target)
        return committed

    def count_rows(self, files: list[str], key: tuple[str, ...]) -> tuple[int, int]:
        """Rows in the dataset's ``files`` (as :meth:`commit` returned them), and how many
        distinct values of the ``key`` columns they hold. Reads only those columns of those
        files, on the driver."""
        if not files:
            return 0, 0
        filesystem = self.filesystem()[0]
        table = pq.read_table(files, columns=list(key), filesystem=filesystem)
        return table.num_rows, table.group_by(list(key)).aggregate([]).num_rows

    def discard(self, batch_id: str) -> None:
        """Delete what is left of a batch's staging directory."""
        filesystem, root = self.filesystem()
        directory = posixpath.join(root, STAGING_DIR, batch_id)
        if filesystem.get_file_info(directory).type != fs.FileType.NotFound:
            filesystem.delete_dir(directory)


class StagedFile:
    """One task's rows of a batch, buffered and staged as one Parquet file (on an executor).

    Rows arrive in small chunks (small, so that a chunk's objects are freed before the garbage
    collector looks at them) and are written a row group at a time.
    """

    def __init__(self, sink: ParquetSink, batch_id: str, schema: pa.Schema) -> None:
        self.sink, self.batch_id, self.schema = sink, batch_id, schema
        #: Where the file is staged, once anything was written.
        self.path: str | None = None
        self.rows = 0
        self._columns: list[list[Any]] = [[] for _ in schema]
        self._writer: pq.ParquetWriter | None = None

    def append(self, columns: list[Any]) -> None:
        """Append rows given column by column (Python lists, or iterables of one length)."""
        for buffered, column in zip(self._columns, columns, strict=True):
            buffered.extend(column)
        if len(self._columns[0]) >= ROW_GROUP_ROWS:
            self._write()

    def close(self) -> None:
        """Write what is buffered and close the file (nothing is staged for no rows)."""
        if self._columns[0]:
            self._write()
        if self._writer is not None:
            self._writer.close()

    def _write(self) -> None:
        if self._writer is None:
            filesystem, _ = self.sink.filesystem()
            name = f"part-{self.batch_id}-{uuid.uuid4().hex[:12]}.parquet"
            self.path = self.sink.staging_path(self.batch_id, name)
            filesystem.create_dir(posixpath.dirname(self.path), recursive=True)
            self._writer = pq.ParquetWriter(self.path, self.schema, filesystem=filesystem)
        batch = pa.record_batch(
            [pa.array(c, f.type) for c, f in zip(self._columns, self.schema, strict=True)],
            schema=self.schema,
        )
        self._writer.write_batch(batch)
        self.rows += batch.num_rows
        self._columns = [[] for _ in self.schema]


@functools.lru_cache(maxsize=16)
def _open_filesystem(uri: str) -> tuple[fs.FileSystem, str]:
    """One filesystem object per URI and process (an object store client is costly to make)."""
    return fs.FileSystem.from_uri(uri)  # type: ignore[no-any-return]
