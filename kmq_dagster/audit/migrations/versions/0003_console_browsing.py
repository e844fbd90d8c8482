"""The console: error patterns, browsing indexes, the header index, dead-letter history,
and the newest queue snapshot per group.

Existing dead letters get their error pattern and header rows here, in batches.

Revision ID: 0003
Revises: 0002
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

from kmq_dagster.audit.causes import error_pattern
from kmq_dagster.audit.indexing import side_rows

revision = "0003"
down_revision = "0002"

BATCH = 2_000

_INDEXES = {
    "ix_dead_letters_browse": ["queue_topic", "group_id", "last_failure_at", "id"],
    "ix_dead_letters_cause": [
        "queue_topic", "group_id", "error_type", "error_pattern", "status", "last_failure_at",
    ],
    "ix_dead_letters_time": ["last_failure_at", "id"],
    "ix_dead_letters_original": ["original_topic", "original_partition", "original_offset"],
}  # fmt: skip


def upgrade() -> None:
    op.add_column(
        "dead_letters",
        sa.Column("error_pattern", sa.String(400), nullable=False, server_default=""),
    )
    op.create_table(
        "dead_letter_headers",
        sa.Column("dead_letter_id", sa.Integer, primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("value_sha256", sa.String(64)),
    )
    op.create_index(
        "ix_dead_letter_headers_lookup", "dead_letter_headers", ["name", "value_sha256"]
    )
    op.create_table(
        "dead_letter_search",
        sa.Column("dead_letter_id", sa.Integer, primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_table(
        "dead_letter_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dlq_topic", sa.String(249), nullable=False),
        sa.Column("dlq_partition", sa.Integer, nullable=False),
        sa.Column("dlq_offset", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("copy_topic", sa.String(249)),
        sa.Column("copy_partition", sa.Integer),
        sa.Column("copy_offset", sa.BigInteger),
    )
    op.create_index(
        "ix_dead_letter_events_coords",
        "dead_letter_events",
        ["dlq_topic", "dlq_partition", "dlq_offset"],
    )
    _backfill(op.get_bind())
    for name, columns in _INDEXES.items():
        op.create_index(name, "dead_letters", columns)
    op.create_index("ix_dead_letters_key", "dead_letters", ["key"], postgresql_using="hash")
    op.create_index(
        "ix_queue_snapshots_queue", "queue_snapshots", ["queue_topic", "group_id", "at"]
    )


def _backfill(connection: sa.Connection) -> None:
    """Error patterns and side rows of the dead letters stored before this revision."""
    dead_letters = sa.table(
        "dead_letters",
        sa.column("id", sa.Integer),
        sa.column("value", sa.LargeBinary),
        sa.column("error_message", sa.Text),
        sa.column("error_pattern", sa.String),
        sa.column("reason", sa.Text),
        sa.column("headers", sa.JSON),
    )
    search_rows = sa.table(
        "dead_letter_search",
        sa.column("dead_letter_id", sa.Integer),
        sa.column("body", sa.Text),
        sa.column("reason", sa.Text),
    )
    header_rows = sa.table(
        "dead_letter_headers",
        sa.column("dead_letter_id", sa.Integer),
        sa.column("position", sa.Integer),
        sa.column("name", sa.String),
        sa.column("value_sha256", sa.String),
    )
    last_id = 0
    while True:
        batch = connection.execute(
            sa.select(dead_letters)
            .where(dead_letters.c.id > last_id)
            .order_by(dead_letters.c.id)
            .limit(BATCH)
        ).all()
        if not batch:
            return
        last_id = batch[-1].id
        connection.execute(
            sa.update(dead_letters)
            .where(dead_letters.c.id == sa.bindparam("row_id"))
            .values(error_pattern=sa.bindparam("pattern")),
            [{"row_id": row.id, "pattern": error_pattern(row.error_message)} for row in batch],
        )
        headers: list[dict[str, Any]] = []
        searches: list[dict[str, Any]] = []
        for row in batch:
            header_part, search = side_rows(row.id, dict(row._mapping))
            headers += header_part
            searches.append(search)
        if headers:
            connection.execute(sa.insert(header_rows), headers)
        connection.execute(sa.insert(search_rows), searches)


def downgrade() -> None:
    op.drop_index("ix_queue_snapshots_queue", "queue_snapshots")
    op.drop_index("ix_dead_letters_key", "dead_letters")
    for name in _INDEXES:
        op.drop_index(name, "dead_letters")
    op.drop_table("dead_letter_events")
    op.drop_table("dead_letter_search")
    op.drop_table("dead_letter_headers")
    op.drop_column("dead_letters", "error_pattern")
