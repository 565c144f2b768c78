"""The built wheel carries the SQL files, so a plain `pip install .` finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.processes import output

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_the_schema_and_queries(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, output(built)
    (wheel,) = tmp_path.glob("dbos_agent-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"dbos_agent/sql/queries.sql"} | {
        f"dbos_agent/sql/migrations/{p.name}"
        for p in (ROOT / "dbos_agent" / "sql" / "migrations").glob("*.sql")
    }
    assert expected <= names, expected - names
    assert "dbos_agent/py.typed" in names
