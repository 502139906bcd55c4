"""A runtime read of a current database imports no alembic: a fresh process's first lookup stays cheap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from db import Store

ROOT = Path(__file__).resolve().parents[2]


def test_reading_a_current_database_leaves_alembic_unimported(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    Store(url).close()  # created at the newest schema
    code = ("import sys; from db import Store; s = Store.open_readonly(sys.argv[1]); print(s.records()); "
            "print('alembic' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, url], env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "False"]
