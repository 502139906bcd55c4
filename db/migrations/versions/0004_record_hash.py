"""Records are unique by a hash of their key, not by the key: long grouped keys fit on PostgreSQL.

A grouped problem's key lists every member GEMM and runs to kilobytes; PostgreSQL refuses a btree index
entry over about 2.7 KB, so the unique constraint on (device_name, kernel, problem_key, mode) failed the
insert of such a record. The constraint moves to ``record_hash``, the SHA-1 of those four (as the fleet's
tables do with ``problem_hash``), filled here for every row; an index on (device_name, kernel) keeps the
listing by device and kernel indexed now that the old constraint's index is gone. problem_key stays Text.

Downgrade restores the old constraint; on PostgreSQL it fails, changing nothing, while a record's key is
too long for that index (delete those records first: the older schema cannot hold them).

Revision ID: 0004_record_hash
Revises: 0003_fleet
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0004_record_hash"
down_revision = "0003_fleet"
branch_labels = None
depends_on = None

_OLD_UNIQUE = "uq_tuner_records_device_kernel_problem_mode"
_UNIQUE = "uq_tuner_records_record_hash"
_INDEX = "ix_tuner_records_device_kernel"
_HASH = sa.String(40)


def _record_hash(device_name: str, kernel: str, problem_key: str, mode: str) -> str:
    # Frozen copy of db.models.record_hash: the store looks rows up by this value, so the two must agree.
    return hashlib.sha1("\x00".join((device_name, kernel, problem_key, mode)).encode()).hexdigest()


def upgrade() -> None:
    with op.batch_alter_table("tuner_records", recreate="auto") as batch:
        batch.add_column(sa.Column("record_hash", _HASH, nullable=True))
    connection = op.get_bind()
    rows = connection.execute(sa.text("SELECT id, device_name, kernel, problem_key, mode FROM tuner_records")).all()
    if rows:
        connection.execute(sa.text("UPDATE tuner_records SET record_hash = :hash WHERE id = :id"),
                           [{"id": row.id, "hash": _record_hash(row.device_name, row.kernel, row.problem_key,
                                                                row.mode)} for row in rows])
    with op.batch_alter_table("tuner_records", recreate="auto") as batch:
        batch.alter_column("record_hash", existing_type=_HASH, nullable=False)
        batch.drop_constraint(_OLD_UNIQUE, type_="unique")
        batch.create_unique_constraint(_UNIQUE, ["record_hash"])
        batch.create_index(_INDEX, ["device_name", "kernel"])


def downgrade() -> None:
    with op.batch_alter_table("tuner_records", recreate="auto") as batch:
        batch.drop_index(_INDEX)
        batch.drop_constraint(_UNIQUE, type_="unique")
        batch.create_unique_constraint(_OLD_UNIQUE, ["device_name", "kernel", "problem_key", "mode"])
        batch.drop_column("record_hash")
