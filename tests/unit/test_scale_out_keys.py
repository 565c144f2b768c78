"""schema.sql stays ready to be distributed by workflow id (docs/operating/scale-out.md).

Citus enforces a primary key or a unique constraint only within a shard, so on a table
distributed by a column each of them must contain that column; and a foreign key must
point at a reference table, or at a co-located table through the distribution column.
These rules cost nothing on one Postgres and are cheap to keep now, expensive to retrofit
on a table full of rows, so this test reads them off schema.sql (no database) and fails
when a new table, key or reference breaks them, or when a table is added without saying
how it would be placed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from dbos_agent._storage.sql_files import schema

#: Tables distributed by workflow id: the column that holds the workflow they belong to.
DISTRIBUTED: dict[str, str] = {
    "workflows": "workflow_id",
    "steps": "workflow_id",
    "messages": "destination_id",
    "events": "workflow_id",
    "streams": "workflow_id",
    "approvals": "workflow_id",
    # keyed by the family's root: a child's model reply updates its root's row
    "family_usage": "workflow_id",
}

#: Small tables, one full copy on every node (Citus reference tables); server_epochs goes
#: where executors goes (the epochs are those of the server that judges the sessions);
#: queues is a few rows every process reads every second.
REFERENCE: set[str] = {"executors", "schedules", "server_epochs", "queues"}

#: Unique indexes across workflows, which Citus cannot enforce on a distributed table,
#: and why they may stay on one Postgres (docs/operating/scale-out.md says what replaces them).
CROSS_WORKFLOW_UNIQUE: dict[str, str] = {
    "workflows_queue_dedup": "an enqueue's dedup id is unique per queue: on Citus it "
    "moves to a table keyed by (queue, dedup id) or the workflow id is derived from it",
}


@dataclass
class Table:
    name: str
    columns: list[str] = field(default_factory=list)
    primary_key: list[str] = field(default_factory=list)
    #: (constraint or index name, columns)
    uniques: list[tuple[str, list[str]]] = field(default_factory=list)
    #: (local columns, referenced table, referenced columns)
    references: list[tuple[list[str], str, list[str]]] = field(default_factory=list)


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def _columns(text: str) -> list[str]:
    return [c.strip().strip('"') for c in text.split(",") if c.strip()]


def _top_level_items(body: str) -> list[str]:
    """Split a CREATE TABLE body at the commas outside parentheses."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i].strip())
            start = i + 1
    items.append(body[start:].strip())
    return [item for item in items if item]


def _table_body(sql: str, start: int) -> str:
    """The text between the parenthesis at ``start`` and its match."""
    depth = 0
    for i in range(start, len(sql)):
        if sql[i] == "(":
            depth += 1
        elif sql[i] == ")":
            depth -= 1
            if depth == 0:
                return sql[start + 1 : i]
    raise AssertionError("unbalanced parentheses in schema.sql")


_CREATE_TABLE = re.compile(r"CREATE TABLE (?:IF NOT EXISTS )?dbos_agent\.(\w+)\s*\(", re.I)
_REFERENCES = re.compile(r"REFERENCES\s+(?:dbos_agent\.)?(\w+)\s*(?:\(([^)]*)\))?", re.I)
_UNIQUE_INDEX = re.compile(
    r"CREATE UNIQUE INDEX (?:IF NOT EXISTS )?(\w+)\s+ON\s+dbos_agent\.(\w+)\s*\(([^)]*)\)", re.I
)


def parse_tables(sql: str) -> dict[str, Table]:
    """The tables of a schema file: columns, primary key, unique keys, references."""
    sql = _strip_comments(sql)
    tables: dict[str, Table] = {}
    for match in _CREATE_TABLE.finditer(sql):
        table = Table(match.group(1))
        for item in _top_level_items(_table_body(sql, match.end() - 1)):
            constraint = re.match(r"CONSTRAINT\s+(\w+)\s+(.*)", item, re.I | re.S)
            name, rest = (constraint.group(1), constraint.group(2)) if constraint else ("", item)
            if key := re.match(r"PRIMARY KEY\s*\(([^)]*)\)", rest, re.I):
                table.primary_key = _columns(key.group(1))
            elif key := re.match(r"UNIQUE\s*\(([^)]*)\)", rest, re.I):
                table.uniques.append((name, _columns(key.group(1))))
            elif key := re.match(r"FOREIGN KEY\s*\(([^)]*)\)", rest, re.I):
                ref = _REFERENCES.search(rest)
                assert ref, f"{table.name}: a FOREIGN KEY without REFERENCES"
                table.references.append(
                    (_columns(key.group(1)), ref.group(1), _columns(ref.group(2) or ""))
                )
            elif not re.match(r"(CHECK|EXCLUDE)\b", rest, re.I):
                column = rest.split()[0].strip('"')
                table.columns.append(column)
                if re.search(r"\bPRIMARY KEY\b", rest, re.I):
                    table.primary_key = [column]
                if re.search(r"\bUNIQUE\b", rest, re.I):
                    table.uniques.append((f"{table.name}_{column}_key", [column]))
                if ref := _REFERENCES.search(rest):
                    table.references.append(([column], ref.group(1), _columns(ref.group(2) or "")))
        tables[table.name] = table
    for match in _UNIQUE_INDEX.finditer(sql):
        tables[match.group(2)].uniques.append((match.group(1), _columns(match.group(3))))
    return tables


def placement_problems(tables: dict[str, Table]) -> list[str]:
    """Every way the tables break the rules of a schema distributed by workflow id."""
    problems: list[str] = []
    for name, table in sorted(tables.items()):
        if name not in DISTRIBUTED and name not in REFERENCE:
            problems.append(f"{name}: neither distributed by workflow id nor a reference table")
            continue
        if not table.primary_key:
            problems.append(f"{name}: no primary key")
        column = DISTRIBUTED.get(name)
        if column is None:
            continue
        if column not in table.columns:
            problems.append(f"{name}: no column {column}")
        if table.primary_key[:1] != [column]:
            problems.append(
                f"{name}: primary key ({', '.join(table.primary_key)}) does not lead with {column}"
            )
        for unique, columns in table.uniques:
            if column not in columns and unique not in CROSS_WORKFLOW_UNIQUE:
                problems.append(f"{name}: unique {unique} ({', '.join(columns)}) lacks {column}")
        for local, target, remote in table.references:
            if target in REFERENCE:
                continue
            if (
                target not in DISTRIBUTED
                or local[:1] != [column]
                or remote[:1] != [DISTRIBUTED[target]]
            ):
                problems.append(
                    f"{name}: foreign key ({', '.join(local)}) to {target} is not co-located"
                )
    for name, table in sorted(tables.items()):
        for _, target, _ in table.references:
            if name in REFERENCE and target in DISTRIBUTED:
                problems.append(f"{name}: reference table points at distributed {target}")
    return problems


def test_every_table_is_ready_to_be_distributed_by_workflow_id() -> None:
    tables = parse_tables(schema())
    assert set(DISTRIBUTED) | REFERENCE <= set(tables), "a table named here left schema.sql"
    assert placement_problems(tables) == []


def test_the_messages_key_leads_with_the_destination() -> None:
    assert parse_tables(schema())["messages"].primary_key == ["destination_id", "message_id"]


def test_every_exception_to_the_rules_is_still_in_the_schema() -> None:
    uniques = {u for table in parse_tables(schema()).values() for u, _ in table.uniques}
    assert set(CROSS_WORKFLOW_UNIQUE) <= uniques


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        (
            "CREATE TABLE dbos_agent.steps (workflow_id text, seq int, id bigint PRIMARY KEY);",
            "steps: primary key (id) does not lead with workflow_id",
        ),
        (
            "CREATE TABLE dbos_agent.messages (message_id bigint PRIMARY KEY,"
            " destination_id text, CONSTRAINT k UNIQUE (destination_id, message_id));",
            "messages: primary key (message_id) does not lead with destination_id",
        ),
        (
            "CREATE TABLE dbos_agent.events (workflow_id text, key text,"
            " PRIMARY KEY (workflow_id, key)); CREATE UNIQUE INDEX e ON dbos_agent.events (key);",
            "events: unique e (key) lacks workflow_id",
        ),
        (
            "CREATE TABLE dbos_agent.workflows (workflow_id text PRIMARY KEY);"
            " CREATE TABLE dbos_agent.steps (workflow_id text, seq int, parent text"
            " REFERENCES dbos_agent.steps (seq), PRIMARY KEY (workflow_id, seq));",
            "steps: foreign key (parent) to steps is not co-located",
        ),
        (
            "CREATE TABLE dbos_agent.workflows (workflow_id text PRIMARY KEY);"
            " CREATE TABLE dbos_agent.executors (session_key int PRIMARY KEY,"
            " last text REFERENCES dbos_agent.workflows (workflow_id));",
            "executors: reference table points at distributed workflows",
        ),
        (
            "CREATE TABLE dbos_agent.tenants (id text PRIMARY KEY);",
            "tenants: neither distributed by workflow id nor a reference table",
        ),
    ],
)
def test_the_rules_catch(sql: str, problem: str) -> None:
    assert problem in placement_problems(parse_tables(sql))


def test_co_located_references_pass() -> None:
    sql = (
        "CREATE TABLE dbos_agent.workflows (workflow_id text PRIMARY KEY);"
        " CREATE TABLE dbos_agent.executors (session_key int PRIMARY KEY);"
        " CREATE TABLE dbos_agent.steps (workflow_id text REFERENCES dbos_agent.workflows"
        " (workflow_id), seq int, owner int, PRIMARY KEY (workflow_id, seq),"
        " FOREIGN KEY (owner) REFERENCES dbos_agent.executors (session_key));"
    )
    assert placement_problems(parse_tables(sql)) == []
