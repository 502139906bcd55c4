"""The tuner_records table as the first release made it (export schema_version 1).

Revision ID: 0001_baseline
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuner_records",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("device_alias", sa.String(64), nullable=False),
        sa.Column("compute_capability", sa.String(16), nullable=False),
        sa.Column("sm_count", sa.Integer, nullable=False),
        sa.Column("kernel", sa.String(128), nullable=False),
        sa.Column("problem_key", sa.Text, nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("layout", sa.String(8), nullable=False),
        sa.Column("shapes", sa.Text, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("time_ms", sa.Float, nullable=False),
        sa.Column("tflops", sa.Float, nullable=False),
        sa.Column("cublas_ms", sa.Float, nullable=True),
        sa.Column("triton_config", sa.Text, nullable=True),
        sa.Column("triton_ms", sa.Float, nullable=True),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64), nullable=False),
        sa.Column("cuda_version", sa.String(64), nullable=False),
        sa.Column("trials", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("device_name", "kernel", "problem_key",
                            name="uq_tuner_records_device_kernel_problem"),
    )
    op.create_index("ix_tuner_records_device_alias", "tuner_records", ["device_alias"])


def downgrade() -> None:
    op.drop_index("ix_tuner_records_device_alias", table_name="tuner_records")
    op.drop_table("tuner_records")
