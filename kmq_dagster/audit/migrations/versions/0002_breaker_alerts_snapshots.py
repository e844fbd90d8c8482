"""Circuit breaker state and transitions, alerts, queue snapshots.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def _queue_columns() -> list[sa.Column[str]]:
    return [
        sa.Column("queue_topic", sa.String(249), nullable=False),
        sa.Column("group_id", sa.String(255), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "breaker_transitions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        *_queue_columns(),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=False),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("error_rate", sa.Float, nullable=False),
        sa.Column("window_calls", sa.Integer, nullable=False),
        sa.Column("window_ms", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_table(
        "breaker_states",
        sa.Column("queue_topic", sa.String(249), primary_key=True),
        sa.Column("group_id", sa.String(255), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("opened_at_ms", sa.BigInteger, nullable=False),
        sa.Column("cooldown_ms", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        *_queue_columns(),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
    )
    op.create_table(
        "queue_snapshots",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        *_queue_columns(),
        sa.Column("lag", sa.BigInteger, nullable=False),
        sa.Column("inflight", sa.BigInteger, nullable=False),
        sa.Column("oldest_unacked_age_ms", sa.BigInteger),
        sa.Column("in_rate", sa.Float, nullable=False),
        sa.Column("ack_rate", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("queue_snapshots", "alerts", "breaker_states", "breaker_transitions"):
        op.drop_table(table)
