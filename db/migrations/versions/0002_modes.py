"""Two ways to be called: a winner per dispatch mode ("eager" and "graph").

Records written before this revision were timed by ``do_bench`` with L2 flushed between calls, which
hides up to ~80 us of host time per call: what a CUDA-graph replay sees. They become "graph" records;
nothing is dropped. The unique key gains the mode.

Revision ID: 0002_modes
Revises: 0001_baseline
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_modes"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_records", recreate="auto") as batch:
        batch.add_column(sa.Column("mode", sa.String(8), nullable=False, server_default="graph"))
        batch.drop_constraint("uq_tuner_records_device_kernel_problem", type_="unique")
        batch.create_unique_constraint("uq_tuner_records_device_kernel_problem_mode",
                                       ["device_name", "kernel", "problem_key", "mode"])


def downgrade() -> None:
    # The older schema holds one record per problem: the eager winners have no place there.
    op.execute(sa.text("DELETE FROM tuner_records WHERE mode <> 'graph'"))
    with op.batch_alter_table("tuner_records", recreate="auto") as batch:
        batch.drop_constraint("uq_tuner_records_device_kernel_problem_mode", type_="unique")
        batch.create_unique_constraint("uq_tuner_records_device_kernel_problem",
                                       ["device_name", "kernel", "problem_key"])
        batch.drop_column("mode")
