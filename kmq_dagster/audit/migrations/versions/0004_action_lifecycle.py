"""Audit before effect: an action's state, owner and heartbeat, the leases that serialize
actions on overlapping dead letters, and a replay event's state and action.

Actions written before this revision finished before it: they become ``succeeded`` (or
``failed`` when their outcome says so); their replay events were acknowledged copies.

Revision ID: 0004
Revises: 0003
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    with op.batch_alter_table("actions") as actions:
        actions.add_column(
            sa.Column("state", sa.String(16), nullable=False, server_default="succeeded")
        )
        actions.add_column(sa.Column("finished_at", sa.DateTime(timezone=True)))
        actions.add_column(sa.Column("owner", sa.String(255)))
        actions.add_column(sa.Column("expires_at", sa.DateTime(timezone=True)))
    table = sa.table("actions", sa.column("outcome", sa.Text), sa.column("state", sa.String))
    op.execute(table.update().where(table.c.outcome.like("failed%")).values(state="failed"))
    op.create_index("ix_actions_state", "actions", ["state"])
    leases = op.create_table(
        "action_leases",
        sa.Column("action_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("queue_topic", sa.String(249), nullable=False),
        sa.Column("group_id", sa.String(255), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
    )
    guard = {"action_id": 0, "queue_topic": "", "group_id": "", "acquired_at": datetime.now(UTC)}
    op.bulk_insert(leases, [guard])
    with op.batch_alter_table("dead_letter_events") as events:
        events.add_column(sa.Column("action_id", sa.Integer))
        events.add_column(sa.Column("state", sa.String(16)))
    table = sa.table("dead_letter_events", sa.column("kind", sa.String), sa.column("state"))
    op.execute(table.update().where(table.c.kind == "replay").values(state="sent"))
    op.create_index("ix_dead_letter_events_action", "dead_letter_events", ["action_id"])


def downgrade() -> None:
    op.drop_index("ix_dead_letter_events_action", "dead_letter_events")
    with op.batch_alter_table("dead_letter_events") as events:
        events.drop_column("state")
        events.drop_column("action_id")
    op.drop_table("action_leases")
    op.drop_index("ix_actions_state", "actions")
    with op.batch_alter_table("actions") as actions:
        for column in ("expires_at", "owner", "finished_at", "state"):
            actions.drop_column(column)
