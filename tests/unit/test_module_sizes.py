"""Small modules with one job: no module of the library is over 600 lines.

A module that grows past it has taken on a second job; split it where the jobs part
(as the engine's admission, run endings and dispatcher left ``runtime/core.py``)."""

from __future__ import annotations

from pathlib import Path

import dbos_agent

LIMIT = 600


def test_no_library_module_is_over_the_limit() -> None:
    root = Path(dbos_agent.__file__).parent
    over = {
        str(path.relative_to(root.parent)): lines
        for path in sorted(root.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert not over, f"modules over {LIMIT} lines (split each where its jobs part): {over}"
