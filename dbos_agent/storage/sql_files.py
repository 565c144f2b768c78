"""Locate and parse the SQL shipped with the package.

The repository keeps its SQL in the top-level ``sql/`` folder; a built wheel
carries the same files as ``dbos_agent/sql``. Both layouts are looked up so
that editable and regular installs behave the same.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_NAME_LINE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@cache
def sql_dir() -> Path:
    """The folder holding ``queries.sql`` and ``migrations/``."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "sql", package.parent / "sql"):
        if (candidate / "queries.sql").is_file():
            return candidate
    raise FileNotFoundError(
        f"dbos_agent's SQL files are missing: looked in {package / 'sql'} and "
        f"{package.parent / 'sql'}; reinstall the package"
    )


def parse_named_queries(text: str) -> dict[str, str]:
    """Split a queries file into ``{name: sql}`` at each ``-- name:`` line."""
    queries: dict[str, str] = {}
    matches = list(_NAME_LINE.finditer(text))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        body = text[match.end() : end].strip()
        name = match.group(1)
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice in queries.sql")
        queries[name] = body.rstrip(";").strip()
    return queries


@cache
def queries() -> dict[str, str]:
    """Every named query in ``queries.sql``."""
    return parse_named_queries((sql_dir() / "queries.sql").read_text(encoding="utf-8"))


def migrations() -> list[tuple[int, str, str]]:
    """``(version, file name, sql)`` for each numbered migration, in order."""
    found: list[tuple[int, str, str]] = []
    for path in sorted((sql_dir() / "migrations").glob("*.sql")):
        number = path.name.split("_", 1)[0]
        if not number.isdigit():
            raise ValueError(f"migration file {path.name} does not start with a number")
        found.append((int(number), path.name, path.read_text(encoding="utf-8")))
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1, 2, 3, ... without gaps: {versions}")
    return found
