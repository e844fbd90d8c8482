"""An audit store left at an older schema revision, as an older kmq wrote it (upgrade tests)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine


def engine_at_revision(url: str, revision: str) -> Engine:
    """An engine on the empty database ``url`` with the audit schema migrated up to
    ``revision`` (an Alembic revision id such as ``"0002"``) and no further."""
    engine = create_engine(url)
    config = Config()
    config.set_main_option("script_location", "kmq_dagster.audit:migrations")
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    return engine
