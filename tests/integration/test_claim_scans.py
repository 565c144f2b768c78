"""A take-over reads the dead sessions' PENDING workflows, not every PENDING row: with
thousands of workflows running under live sessions, claim_workflows and probe_orphans
look at a few rows (from workflows_pending_by_owner, migration 020), whatever the plan
would have been for "the owner is among the dead" tested on each row."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from dbos_agent._storage.database import SystemDatabase
from dbos_agent._storage.locks import SESSION_LOCK_CLASS
from dbos_agent._storage.rows import Runner
from dbos_agent._storage.sql_files import query
from tests.helpers import migrated_database

LIVE = 4  # sessions 1..4 hold their locks; session 9 is dead (a clean exit's -infinity)
RUNNING = 5000  # PENDING workflows of the live sessions
ORPHANS = 30  # PENDING workflows of the dead one
RUNNER = Runner(["job"], None, "code")


@pytest.fixture
def database(dbos_agent_postgres_url: str) -> Iterator[str]:
    with migrated_database(dbos_agent_postgres_url) as url:
        with psycopg.connect(url) as conn:
            conn.execute(
                "INSERT INTO dbos_agent.executors"
                " (session_key, executor_id, hostname, pid, lease_seconds, heartbeat_at)"
                " SELECT k, 'exec-' || k, 'test', k, 3600,"
                "        CASE WHEN k = 9 THEN '-infinity'::timestamptz ELSE now() END"
                " FROM unnest(ARRAY[1, 2, 3, 4, 9]) AS k"
            )
            conn.execute(
                "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs,"
                " executor_id, max_recovery_attempts, created_at, owner_key)"
                " SELECT 'live-' || i, 'job', 'PENDING', '[]', 'exec', 10,"
                "        now() - make_interval(secs => %(n)s - i), i %% %(live)s + 1"
                " FROM generate_series(1, %(n)s) AS i",
                {"n": RUNNING, "live": LIVE},
            )
            conn.execute(
                "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs,"
                " executor_id, max_recovery_attempts, created_at, owner_key)"
                " SELECT 'orphan-' || i, 'job', 'PENDING', '[]', 'exec', 10, now(), 9"
                " FROM generate_series(1, %(n)s) AS i",
                {"n": ORPHANS},
            )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE dbos_agent.workflows, dbos_agent.executors")
        yield url


@pytest.fixture
def live_sessions(database: str) -> Iterator[None]:
    with psycopg.connect(database, autocommit=True) as conn:
        for key in range(1, LIVE + 1):
            conn.execute("SELECT pg_advisory_lock(%s, %s)", (SESSION_LOCK_CLASS, key))
        yield


def workflow_rows_read(plan: dict[str, Any]) -> int:
    """Rows of ``workflows`` the plan's scans returned or filtered out, over all loops."""
    read = 0
    if plan.get("Relation Name") == "workflows":
        loops = int(plan.get("Actual Loops", 1))
        read += (
            int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
        ) * loops
    return read + sum(workflow_rows_read(child) for child in plan.get("Plans", []))


def rows_read(url: str, name: str, params: dict[str, Any]) -> int:
    with psycopg.connect(url) as conn, conn.transaction(force_rollback=True):
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + query(name),
            params,
        ).fetchone()
    assert row is not None
    return workflow_rows_read(row[0][0]["Plan"])


def claim_params(**overrides: Any) -> dict[str, Any]:
    return {
        "owner_key": 1,
        "executor_id": "exec",
        "orphans": True,
        "skip_ids": [],
        "after_created_at": datetime(1970, 1, 1, tzinfo=UTC),
        "after_workflow_id": "",
        "limit": 100,
        **RUNNER.params(),
    } | overrides


@pytest.mark.usefixtures("live_sessions")
def test_a_claim_reads_the_orphans_and_not_the_running(database: str) -> None:
    assert rows_read(database, "claim_workflows", claim_params()) < 10 * ORPHANS
    db = SystemDatabase(database, pool_size=1)
    try:
        first = db.recovery.claim(
            executor_id="exec", owner_key=1, runner=RUNNER, skip_ids=[], orphans=True,
            after=None, limit=20,
        )  # fmt: skip
        rest = db.recovery.claim(
            executor_id="exec", owner_key=1, runner=RUNNER, skip_ids=[], orphans=True,
            after=(first[-1].created_at, first[-1].workflow_id), limit=20,
        )  # fmt: skip
    finally:
        db.close()
    claimed = [c.workflow_id for c in first + rest]
    assert len(first) == 20 and sorted(claimed) == sorted(f"orphan-{i}" for i in range(1, 31))


@pytest.mark.usefixtures("live_sessions")
def test_an_idle_probe_reads_a_few_rows(database: str) -> None:
    with psycopg.connect(database) as conn:
        conn.execute("UPDATE dbos_agent.workflows SET owner_key = 1 WHERE owner_key = 9")
    probe = {"owner_key": 1, **RUNNER.params()}
    assert rows_read(database, "probe_orphans", probe) < 10
    db = SystemDatabase(database, pool_size=1)
    try:
        claimable, _ = db.recovery.probe_orphans(owner_key=2, runner=RUNNER)
        assert not claimable
        with psycopg.connect(database) as conn:  # one owned by nobody: claimable at once
            conn.execute("UPDATE dbos_agent.workflows SET owner_key = NULL"
                         " WHERE workflow_id = 'live-7'")  # fmt: skip
        assert db.recovery.probe_orphans(owner_key=2, runner=RUNNER)[0]
    finally:
        db.close()
