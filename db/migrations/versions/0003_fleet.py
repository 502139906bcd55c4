"""The fleet: a job queue (tuner_jobs), its workers (tuner_workers) and recorded problems (tuner_recorded).

Revision ID: 0003_fleet
Revises: 0002_modes
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_fleet"
down_revision = "0002_modes"
branch_labels = None
depends_on = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tuner_jobs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("problem_hash", sa.String(40), nullable=False),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("kernel", sa.String(128), nullable=False),
        sa.Column("problem_key", sa.Text, nullable=False),
        sa.Column("budget_trials", sa.Integer, nullable=False),
        sa.Column("budget_seconds", sa.Float, nullable=True),
        sa.Column("options", sa.Text, nullable=False),
        sa.Column("priority", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("lease_until", _WHEN, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("started_at", _WHEN, nullable=True),
        sa.Column("finished_at", _WHEN, nullable=True),
        sa.UniqueConstraint("problem_hash", name="uq_tuner_jobs_problem"),
    )
    op.create_index("ix_tuner_jobs_device_name", "tuner_jobs", ["device_name"])
    op.create_index("ix_tuner_jobs_state", "tuner_jobs", ["state"])
    op.create_table(
        "tuner_workers",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("job_id", sa.Integer, nullable=True),
        sa.Column("jobs_done", sa.Integer, nullable=False),
        sa.Column("started_at", _WHEN, nullable=False),
        sa.Column("heartbeat_at", _WHEN, nullable=False),
    )
    op.create_table(
        "tuner_recorded",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("problem_hash", sa.String(40), nullable=False),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("kernel", sa.String(128), nullable=False),
        sa.Column("problem_key", sa.Text, nullable=False),
        sa.Column("calls", sa.BigInteger, nullable=False),
        sa.Column("flops", sa.Float, nullable=False),
        sa.Column("first_seen", _WHEN, nullable=False),
        sa.Column("last_seen", _WHEN, nullable=False),
        sa.UniqueConstraint("problem_hash", name="uq_tuner_recorded_problem"),
    )
    op.create_index("ix_tuner_recorded_device_name", "tuner_recorded", ["device_name"])


def downgrade() -> None:
    op.drop_index("ix_tuner_recorded_device_name", table_name="tuner_recorded")
    op.drop_table("tuner_recorded")
    op.drop_table("tuner_workers")
    op.drop_index("ix_tuner_jobs_state", table_name="tuner_jobs")
    op.drop_index("ix_tuner_jobs_device_name", table_name="tuner_jobs")
    op.drop_table("tuner_jobs")
