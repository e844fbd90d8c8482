"""Alembic environment: kmq runs migrations itself, on the connection the store hands over."""

from alembic import context

from kmq_dagster.audit.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
