"""Dead letters and operator actions.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dlq_topic", sa.String(249), nullable=False),
        sa.Column("dlq_partition", sa.Integer, nullable=False),
        sa.Column("dlq_offset", sa.BigInteger, nullable=False),
        sa.Column("queue_topic", sa.String(249), nullable=False),
        sa.Column("group_id", sa.String(255), nullable=False),
        sa.Column("key", sa.LargeBinary),
        sa.Column("value", sa.LargeBinary),
        sa.Column("value_size", sa.Integer, nullable=False),
        sa.Column("value_truncated", sa.Boolean, nullable=False),
        sa.Column("headers", sa.JSON, nullable=False),
        sa.Column("error_type", sa.String(256), nullable=False),
        sa.Column("error_message", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("original_topic", sa.String(249)),
        sa.Column("original_partition", sa.Integer),
        sa.Column("original_offset", sa.BigInteger),
        sa.Column("first_failure_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_failure_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "dlq_topic", "dlq_partition", "dlq_offset", name="uq_dead_letter_coords"
        ),
        sa.CheckConstraint(
            "status IN ('new', 'replayed', 'discarded')", name="ck_dead_letter_status"
        ),
    )
    op.create_index("ix_dead_letters_queue", "dead_letters", ["queue_topic", "group_id", "status"])
    op.create_table(
        "actions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queue_topic", sa.String(249), nullable=False),
        sa.Column("group_id", sa.String(255), nullable=False),
        sa.Column("selection", sa.Text, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("target", sa.String(249)),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("actions")
    op.drop_index("ix_dead_letters_queue", "dead_letters")
    op.drop_table("dead_letters")
