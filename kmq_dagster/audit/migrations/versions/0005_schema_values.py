"""Schema Registry values: a dead letter's value format, schema id, subject and version, and
why a framed value could not be decoded.

Dead letters stored before this revision keep these empty (their values are shown as before).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"

_COLUMNS = (
    ("value_format", sa.String(16)),
    ("schema_id", sa.Integer),
    ("schema_subject", sa.String(255)),
    ("schema_version", sa.Integer),
    ("value_undecodable", sa.Text),
)


def upgrade() -> None:
    with op.batch_alter_table("dead_letters") as dead_letters:
        for name, kind in _COLUMNS:
            dead_letters.add_column(sa.Column(name, kind))


def downgrade() -> None:
    with op.batch_alter_table("dead_letters") as dead_letters:
        for name, _kind in reversed(_COLUMNS):
            dead_letters.drop_column(name)
