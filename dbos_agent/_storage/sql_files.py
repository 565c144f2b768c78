"""The SQL shipped inside the package: named queries, numbered migrations, the schema.

``dbos_agent/sql/`` holds ``queries.sql`` (every statement, each under a
``-- name: verb_noun`` line), ``migrations/NNN_*.sql`` and ``schema.sql`` (what the
migrations add up to, for reading; a test keeps the two equal). It is read through
``importlib.resources``, so a checkout, an editable install and a wheel find it alike.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import LiteralString

_NAME_LINE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_SCOPE_LINE = re.compile(r"^--\s*scope:(.*)$", re.MULTILINE)
_NAMED_PARAM = re.compile(r"%\((\w+)\)s|%%")

#: What a named query may touch, as its ``-- scope:`` line says: the rows of one
#: workflow, of one workflow and those linked to it, or anything else. Which statements
#: stay on one workflow's rows is what decides whether they can go to one shard.
SCOPES = ("one workflow", "a family", "many")


def _sql_dir() -> Traversable:
    return resources.files("dbos_agent").joinpath("sql")


def parse_named_queries(text: str) -> dict[str, str]:
    """Split a queries file into ``{name: sql}`` at each ``-- name:`` line."""
    found: dict[str, str] = {}
    matches = list(_NAME_LINE.finditer(text))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        body = text[match.end() : end].strip()
        name = match.group(1)
        if name in found:
            raise ValueError(f"query {name!r} is defined twice in queries.sql")
        found[name] = body.rstrip(";").strip()
    return found


def query_scopes(text: str) -> dict[str, list[str]]:
    """``{name: [scope, ...]}``: every ``-- scope:`` line of each named query, as written
    (a well-tagged file has exactly one per query, one of :data:`SCOPES`)."""
    return {
        name: [m.group(1).strip() for m in _SCOPE_LINE.finditer(body)]
        for name, body in parse_named_queries(text).items()
    }


def queries_text() -> str:
    """``queries.sql`` as shipped."""
    return _sql_dir().joinpath("queries.sql").read_text(encoding="utf-8")


@cache
def queries() -> dict[str, str]:
    """Every named query in ``queries.sql``."""
    return parse_named_queries(queries_text())


def query(name: str) -> LiteralString:
    """One named query. Static text shipped with the package, never user input."""
    text: LiteralString = queries()[name]
    return text


@cache
def positional_query(name: str) -> tuple[LiteralString, tuple[str, ...]]:
    """One named query with ``$1, $2, ...`` in place of its ``%(name)s`` parameters,
    and the parameter names in that order: for ``psycopg.RawCursor``, which skips the
    per-call rewriting of named parameters (the checkpoint's hot path runs it for every
    step)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text: LiteralString = _NAMED_PARAM.sub(number, query(name))
    return text, tuple(names)


def migrations() -> list[tuple[int, str, str]]:
    """``(version, file name, sql)`` for each numbered migration, in order."""
    found: list[tuple[int, str, str]] = []
    folder = _sql_dir().joinpath("migrations")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        number = entry.name.split("_", 1)[0]
        if not number.isdigit():
            raise ValueError(f"migration file {entry.name} does not start with a number")
        found.append((int(number), entry.name, entry.read_text(encoding="utf-8")))
    versions = [v for v, _, _ in found]
    # A number may be missing: work done side by side reserves numbers, and a migration
    # merged later is still applied where it is missing (migrate() goes by number, not by
    # the newest applied). Two files with one number, or none starting at 1, are errors.
    if not versions or versions[0] != 1 or len(set(versions)) != len(versions):
        raise ValueError(f"migrations must be numbered 1, 2, 3, ..., each once: {versions}")
    return found


def schema() -> str:
    """``schema.sql``: the whole schema as the migrations leave it, in one file."""
    return _sql_dir().joinpath("schema.sql").read_text(encoding="utf-8")
