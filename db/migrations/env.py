"""Alembic environment: run on the connection that ``db._migrate`` hands over, never from an ini file.

Our history keeps its own version table (``tuner_alembic_version``): Optuna's ``RDBStorage`` migrates its
tables with alembic too, in ``alembic_version``, and the two histories must never see each other.
"""

from __future__ import annotations

from alembic import context

from db._migrate import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE, render_as_batch=True,
                  transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
