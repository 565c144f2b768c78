"""A family's model spend is a running total kept as each reply is recorded (migration
019), not a sum over the family's log before every model call; logs recorded before the
migration are counted into it once, by the migration itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from dbos_agent._storage.database import SystemDatabase
from dbos_agent._storage.sql_files import migrations
from dbos_agent._storage.steps import ModelUsage
from dbos_agent.testing import fresh_database

NAMES = ["model:a", "model:b"]

WORKFLOW = """INSERT INTO dbos_agent.workflows
    (workflow_id, name, status, inputs, executor_id, max_recovery_attempts, parent_id)
VALUES (%s, 'family_usage.job', 'PENDING', '[]', 'family-usage', 10, %s)"""
STEP = """INSERT INTO dbos_agent.steps (workflow_id, seq, name, status, output, started_at)
VALUES (%s, %s, %s, %s, %s::jsonb, now())"""


def reply(model: str | None, **usage: Any) -> str:
    return json.dumps({"model": model, "usage": usage, "content": []})


def record_family(conn: psycopg.Connection[Any]) -> None:
    """A root, its child and grandchild, and a stranger, with replies and other steps."""
    for wid, parent in [
        ("root", None),
        ("child", "root"),
        ("grandchild", "child"),
        ("other", None),
    ]:
        conn.execute(WORKFLOW, (wid, parent))
    steps: list[tuple[str, int, str, str, str | None]] = [
        ("root", 0, "model:a", "SUCCESS", reply("haiku", input_tokens=100, output_tokens=10)),
        ("root", 1, "tool:x", "SUCCESS", reply("haiku", input_tokens=1000)),  # not a model
        ("child", 0, "model:a", "SUCCESS", reply("haiku", input_tokens=7, output_tokens=3.9)),
        ("child", 1, "model:b", "SUCCESS", reply("", cache_read_input_tokens=5, x="y")),
        (
            "grandchild",
            0,
            "model:a",
            "SUCCESS",
            reply("opus", input_tokens=1, cache_creation_input_tokens=2, output_tokens="9"),
        ),
        ("grandchild", 1, "model:a", "SUCCESS", json.dumps({"model": "opus", "usage": None})),
        ("other", 0, "model:a", "SUCCESS", reply("haiku", input_tokens=50_000)),
    ]
    for row in steps:
        conn.execute(STEP, row)
    # an intent that a result fills later (a non-idempotent model call) counts then, once
    conn.execute(
        "INSERT INTO dbos_agent.steps (workflow_id, seq, name, status, started_at, finished_at)"
        " VALUES ('grandchild', 2, 'model:b', 'PENDING', now(), NULL)"
    )
    conn.execute(
        "UPDATE dbos_agent.steps SET status = 'SUCCESS', finished_at = now(), output = %s::jsonb"
        " WHERE workflow_id = 'grandchild' AND seq = 2",
        (reply("opus", input_tokens=20, output_tokens=2),),
    )
    conn.execute(  # and writing the same result again (a no-op update) adds nothing
        "UPDATE dbos_agent.steps SET status = 'SUCCESS' WHERE workflow_id = 'grandchild'"
        " AND seq = 2"
    )


EXPECTED = [  # per model over root, child and grandchild, steps named in NAMES
    ModelUsage("haiku", 2, 107, 13, 0, 0),
    ModelUsage("opus", 2, 21, 2, 2, 0),
    ModelUsage("unknown", 1, 0, 0, 0, 5),
]


@pytest.fixture
def database(dbos_agent_postgres_url: str) -> Iterator[str]:
    with fresh_database(dbos_agent_postgres_url) as url:
        yield url


def usage_of(url: str, workflow_id: str) -> list[ModelUsage]:
    db = SystemDatabase(url, pool_size=1)
    try:
        db.migrate()
        return db.steps.family_model_usage(workflow_id, NAMES)
    finally:
        db.close()


def test_every_member_of_a_family_reads_the_familys_running_total(database: str) -> None:
    usage_of(database, "nobody")  # migrates
    with psycopg.connect(database) as conn:
        record_family(conn)
    for member in ("root", "child", "grandchild"):
        assert usage_of(database, member) == EXPECTED
    assert usage_of(database, "other") == [ModelUsage("haiku", 1, 50_000, 0, 0, 0)]
    assert usage_of(database, "nobody") == []


def test_the_migration_counts_the_logs_recorded_before_it(database: str) -> None:
    (counting,) = [v for v, name, _ in migrations() if name.endswith("_family_model_usage.sql")]
    with psycopg.connect(database) as conn:
        conn.execute(
            "CREATE SCHEMA dbos_agent; CREATE TABLE dbos_agent.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, name, sql in migrations():
            if version < counting:
                conn.execute(sql)  # shipped SQL
                conn.execute(
                    "INSERT INTO dbos_agent.schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
        record_family(conn)
    assert usage_of(database, "grandchild") == EXPECTED  # migrating counts them
    assert usage_of(database, "other") == [ModelUsage("haiku", 1, 50_000, 0, 0, 0)]


def test_retention_deletes_a_familys_total_with_its_root(database: str) -> None:
    usage_of(database, "nobody")  # migrates
    with psycopg.connect(database) as conn:
        record_family(conn)
        conn.execute(
            "UPDATE dbos_agent.workflows SET status = 'SUCCESS', owner_key = NULL,"
            " created_at = now() - interval '2 days', finished_at = now() - interval '1 day'"
            " WHERE workflow_id IN ('root', 'other')"
        )
    db = SystemDatabase(database, pool_size=1)
    try:
        deleted = db.retention.delete_batch(older_than_s=3600, statuses=["SUCCESS"], batch_size=10)
        assert deleted.workflows == 2
        with psycopg.connect(database) as conn:
            left = conn.execute("SELECT DISTINCT workflow_id FROM dbos_agent.family_usage")
            assert left.fetchall() == []
    finally:
        db.close()
