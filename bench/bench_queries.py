#!/usr/bin/env python3
"""The rewritten statements of queries.sql, before and after, over 100,000 rows.

    python bench/bench_queries.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python bench/bench_queries.py --dsn ... --rows 20000 --repeat 5   # a quicker look

Each scenario gets a database of its own on the DSN's server (``dbos_agent_bench_q_*``,
dropped and created, migrated by dbos_agent), filled by INSERT ... SELECT generate_series
and VACUUM ANALYZEd, then runs the statement as it was (the text is kept below) and as
queries.sql has it now, ``--repeat`` times each (default 7) after one warm-up, under
``EXPLAIN (ANALYZE, FORMAT JSON)``: the median execution time in ms, and the plan's top
nodes. A statement that writes runs in a transaction rolled back each time.

  list_workflows   100,000 workflows (10 names, 1 % ERROR, the rest SUCCESS), newest
                   100 by a filter. ``before_custom``: the plan Postgres makes knowing the
                   values; ``before_generic``: the plan it may switch to once psycopg has
                   prepared the statement (after 5 runs), forced here with plan_cache_mode.
  list_approvals   100,000 approval requests of 10,000 workflows, 50 of them PENDING:
                   one workflow's, and the PENDING ones of all (custom and generic).
  claim_workflows  100,000 PENDING workflows of 10 live sessions (their locks held) and
                   50 of a dead one: one take-over page of 100.
  probe_orphans    the same rows: the take-over pass's look while nothing is wrong (all
                   100,000 of live sessions), which every idle process sends per pass.
  family_usage     one family (a root and 9 children) with 100,000 model replies: what a
                   budget reads before each call. ``before`` also times fetching the rows
                   into Python and summing them (what budget.py did), ``after`` the read.
  record_reply     what the running total costs the write: 2,000 model replies and 2,000
                   no-op steps appended (append_step), each committed (synchronous_commit
                   off: no fsync in the figure), with the family_usage triggers disabled
                   (before) and enabled (after), twice, interleaved: µs per statement.

Prints one JSON line per measurement and ends with a markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from dbos_agent._storage.database import SystemDatabase
from dbos_agent._storage.sql_files import query

# -- the statements as they were --------------------------------------------------------

BEFORE_LIST_WORKFLOWS = """
SELECT workflow_id, name, status, inputs::text, output::text, error::text, executor_id,
       app_version, recovery_attempts, max_recovery_attempts, created_at, updated_at,
       finished_at, wait_kind, wait_target, wait_name, wake_at, run_started_at, diverged
FROM dbos_agent.workflows
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(executor_id)s::text IS NULL OR executor_id = %(executor_id)s::text)
  AND (%(queue_name)s::text IS NULL OR queue_name = %(queue_name)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
ORDER BY created_at DESC, workflow_id DESC
LIMIT %(limit)s"""

BEFORE_LIST_APPROVALS = """
SELECT workflow_id, seq, tool, arguments::text, digest, status, reason, requested_at,
       decided_at
FROM dbos_agent.approvals
WHERE (%(workflow_id)s::text IS NULL AND status = 'PENDING')
   OR workflow_id = %(workflow_id)s::text
ORDER BY requested_at DESC, seq DESC
LIMIT %(limit)s;
"""

BEFORE_LIST_FAMILY_MODEL_USAGE = """
WITH RECURSIVE up AS (
    SELECT workflow_id, parent_id, 0 AS depth
    FROM dbos_agent.workflows WHERE workflow_id = %(workflow_id)s
    UNION ALL
    SELECT w.workflow_id, w.parent_id, u.depth + 1
    FROM dbos_agent.workflows AS w JOIN up AS u ON w.workflow_id = u.parent_id
    WHERE u.depth < 1000
), root AS (
    SELECT workflow_id FROM up ORDER BY depth DESC LIMIT 1
), family AS (
    SELECT workflow_id, 0 AS depth FROM root
    UNION
    SELECT c.workflow_id, f.depth + 1
    FROM dbos_agent.workflows AS c JOIN family AS f ON c.parent_id = f.workflow_id
    WHERE f.depth < 1000
)
SELECT s.output->>'model' AS model, (s.output->'usage')::text AS usage
FROM dbos_agent.steps AS s
JOIN (SELECT DISTINCT workflow_id FROM family) AS f USING (workflow_id)
WHERE s.name = ANY(%(names)s) AND s.status = 'SUCCESS';

"""

BEFORE_CLAIM_WORKFLOWS = """
WITH locked AS (
    SELECT dbos_agent.locked_sessions() AS session_key
), stamped AS (
    UPDATE dbos_agent.executors AS e
    SET lock_lost_at = dbos_agent.now()
    WHERE e.lock_lost_at IS NULL AND e.session_key NOT IN (SELECT session_key FROM locked)
    RETURNING e.session_key
), page AS (
    SELECT w.workflow_id
    FROM dbos_agent.workflows AS w
    WHERE w.status = 'PENDING'
      AND (w.owner_key IS NULL OR w.owner_key IN (SELECT dbos_agent.dead_sessions()))
      AND w.owner_key IS DISTINCT FROM %(owner_key)s
      AND (%(orphans)s OR w.executor_id = %(executor_id)s)
      AND w.name = ANY(%(names)s)
      AND NOT (w.workflow_id = ANY(%(skip_ids)s))
      AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                             %(app_version)s, %(code_version)s)
      AND (w.created_at, w.workflow_id) > (%(after_created_at)s, %(after_workflow_id)s)
    ORDER BY w.created_at, w.workflow_id
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)
UPDATE dbos_agent.workflows AS w
SET recovery_attempts = w.recovery_attempts + 1,
    executor_id = %(executor_id)s,
    run_started_at = now(),
    owner_key = CASE WHEN w.recovery_attempts + 1 > w.max_recovery_attempts
                     THEN NULL ELSE %(owner_key)s END,
    status = CASE WHEN w.recovery_attempts + 1 > w.max_recovery_attempts
                  THEN 'MAX_RECOVERY_ATTEMPTS_EXCEEDED' ELSE w.status END,
    error = CASE WHEN w.recovery_attempts + 1 > w.max_recovery_attempts
                 THEN jsonb_build_object(
                     'type', 'dbos_agent.errors.MaxRecoveryAttemptsExceededError',
                     'message', format('workflow %%s (%%s) was recovered %%s times without '
                                       'finishing; the limit is %%s',
                                       w.workflow_id, w.name, w.recovery_attempts,
                                       w.max_recovery_attempts),
                     'args', jsonb_build_array())
                 ELSE NULL END,
    updated_at = now()
FROM page
WHERE w.workflow_id = page.workflow_id
RETURNING w.workflow_id, w.name, w.status, w.inputs::text, w.created_at,
          w.recovery_attempts, w.max_recovery_attempts"""

BEFORE_PROBE_ORPHANS = """
WITH locked AS (
    SELECT dbos_agent.locked_sessions() AS session_key
), stamped AS (
    UPDATE dbos_agent.executors AS e
    SET lock_lost_at = dbos_agent.now()
    WHERE e.lock_lost_at IS NULL AND e.session_key NOT IN (SELECT session_key FROM locked)
    RETURNING e.session_key
)
SELECT EXISTS (
           SELECT 1
           FROM dbos_agent.workflows AS w
           WHERE w.status = 'PENDING'
             AND (w.owner_key IS NULL OR w.owner_key IN (SELECT dbos_agent.dead_sessions()))
             AND w.owner_key IS DISTINCT FROM %(owner_key)s
             AND w.name = ANY(%(names)s)
             AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                                    %(app_version)s, %(code_version)s)
       ) OR EXISTS (
           SELECT 1
           FROM dbos_agent.workflows AS w
           WHERE w.status = 'DIVERGED' AND w.name = ANY(%(names)s)
             AND dbos_agent.may_run(w.app_version, w.accepted_versions, w.diverged_versions,
                                    %(app_version)s, %(code_version)s)
       ) AS claimable,
       coalesce((SELECT json_agg(json_build_object('session_key', e.session_key,
                                                   'pid', e.pid,
                                                   'process_key', e.process_key))
                 FROM dbos_agent.executors AS e
                 WHERE e.heartbeat_at > '-infinity'
                   AND e.session_key NOT IN (SELECT session_key FROM locked)),
                '[]'::json) AS unlocked"""

# -- fills ---------------------------------------------------------------------------------

WORKFLOWS = """
INSERT INTO dbos_agent.workflows
    (workflow_id, name, status, inputs, output, error, executor_id, max_recovery_attempts,
     created_at, finished_at)
SELECT 'wf-' || i, 'job-' || (i %% 10),
       CASE WHEN i %% 100 = 37 THEN 'ERROR' ELSE 'SUCCESS' END, '[]',
       CASE WHEN i %% 100 = 37 THEN NULL ELSE '1'::jsonb END,
       CASE WHEN i %% 100 = 37 THEN '{"type": "x", "message": "x", "args": []}'::jsonb END,
       'exec-' || (i %% 4), 10,
       now() - make_interval(secs => %(n)s - i), now() - make_interval(secs => %(n)s - i)
FROM generate_series(1, %(n)s) AS i"""

LIVE_SESSIONS = 10
DEAD_SESSION = 99
LOCK_CLASS = 233710


def fill_list_workflows(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute(WORKFLOWS, {"n": n})  # 1 % ERROR


def fill_list_approvals(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute(
        """INSERT INTO dbos_agent.approvals
               (workflow_id, seq, tool, arguments, digest, status, requested_at, decided_at)
           SELECT 'wf-' || (i %% (%(n)s / 10)), i, 'tool', '{}', 'd',
                  CASE WHEN i %% (%(n)s / 50) = 0 THEN 'PENDING' ELSE 'APPROVED' END,
                  now() - make_interval(secs => %(n)s - i),
                  CASE WHEN i %% (%(n)s / 50) = 0 THEN NULL ELSE now() END
           FROM generate_series(1, %(n)s) AS i""",
        {"n": n},
    )


def fill_claims(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute(
        """INSERT INTO dbos_agent.executors
               (session_key, executor_id, hostname, pid, lease_seconds, heartbeat_at)
           SELECT k, 'exec-' || k, 'bench', k, 3600,
                  CASE WHEN k = %(dead)s THEN '-infinity'::timestamptz ELSE now() END
           FROM generate_series(1, %(live)s) AS k UNION ALL
           SELECT %(dead)s, 'exec-dead', 'bench', 99, 1, '-infinity'""",
        {"dead": DEAD_SESSION, "live": LIVE_SESSIONS},
    )
    conn.execute(
        """INSERT INTO dbos_agent.workflows
               (workflow_id, name, status, inputs, executor_id, max_recovery_attempts,
                created_at, owner_key)
           SELECT 'live-' || i, 'job', 'PENDING', '[]', 'exec-' || (i %% %(live)s + 1), 10,
                  now() - make_interval(secs => %(n)s - i), i %% %(live)s + 1
           FROM generate_series(1, %(n)s) AS i""",
        {"n": n, "live": LIVE_SESSIONS},
    )
    conn.execute(
        """INSERT INTO dbos_agent.workflows
               (workflow_id, name, status, inputs, executor_id, max_recovery_attempts,
                created_at, owner_key)
           SELECT 'orphan-' || i, 'job', 'PENDING', '[]', 'exec-dead', 10,
                  now() - make_interval(secs => 50 - i), %(dead)s
           FROM generate_series(1, 50) AS i""",
        {"dead": DEAD_SESSION},
    )


def fill_family(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute(
        """INSERT INTO dbos_agent.workflows
               (workflow_id, name, status, inputs, executor_id, max_recovery_attempts,
                parent_id)
           SELECT CASE WHEN k = 0 THEN 'root' ELSE 'child-' || k END, 'agent', 'PENDING',
                  '[]', 'exec', 10, CASE WHEN k = 0 THEN NULL ELSE 'root' END
           FROM generate_series(0, 9) AS k"""
    )
    conn.execute(
        """INSERT INTO dbos_agent.steps (workflow_id, seq, name, status, output, started_at)
           SELECT CASE WHEN i %% 10 = 0 THEN 'root' ELSE 'child-' || (i %% 10) END, i,
                  'dbos_agent.model', 'SUCCESS',
                  jsonb_build_object('model', 'claude-haiku-4-5', 'content', '[]'::jsonb,
                                     'usage', jsonb_build_object('input_tokens', 1000 + i %% 7,
                                                                 'output_tokens', 100)),
                  now()
           FROM generate_series(1, %(n)s) AS i""",
        {"n": n},
    )


# -- measuring ----------------------------------------------------------------------------


def fresh_db(server: str, suffix: str) -> str:
    name = f"dbos_agent_bench_q_{suffix}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(server)
    info["dbname"] = name
    url = psycopg.conninfo.make_conninfo(**info)
    db = SystemDatabase(url, pool_size=1)
    try:
        db.migrate()
    finally:
        db.close()
    return url


def filled(
    server: str, suffix: str, fill: Callable[[psycopg.Connection[Any], int], None], n: int
) -> str:
    url = fresh_db(server, suffix)
    with psycopg.connect(url) as conn:
        fill(conn, n)
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return url


def _positional(text: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """%(name)s → $n, for PREPARE (the generic plan needs a named prepared statement)."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in order:
            order.append(key)
        return f"${order.index(key) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, text).replace("%%", "%")
    return text, [params[k] for k in order]


def explain(
    conn: psycopg.Connection[Any], text: str, params: dict[str, Any], *, generic: bool = False
) -> tuple[float, str]:
    """Execution time (ms) and the plan's top nodes of one run, rolled back."""
    with conn.transaction(force_rollback=True):
        if not generic:
            row = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + text,  # type: ignore[operator]
                params,
            ).fetchone()
        else:
            positional, values = _positional(text, params)
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            conn.execute("DEALLOCATE ALL")
            conn.execute(f"PREPARE bench_q AS {positional}")  # type: ignore[arg-type]
            literals = sql.SQL(", ").join(sql.Literal(v) for v in values)
            row = conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE bench_q ({})").format(literals)
            ).fetchone()
            conn.execute("DEALLOCATE bench_q")
    assert row is not None
    plan = row[0][0]
    return float(plan["Execution Time"]), _shape(plan["Plan"])


def _shape(node: dict[str, Any], depth: int = 0) -> str:
    """The plan's scans (which index, or Seq Scan), in order: what tells the plans apart."""
    found: list[str] = []

    def walk(n: dict[str, Any]) -> None:
        kind = n["Node Type"]
        if "Scan" in kind and "Relation Name" in n:
            index = n.get("Index Name")
            found.append(f"{kind}({index or n['Relation Name']})")
        for child in n.get("Plans", []):
            walk(child)

    walk(node)
    return ", ".join(dict.fromkeys(found))


RESULTS: list[dict[str, Any]] = []


def measure(
    conn: psycopg.Connection[Any],
    scenario: str,
    case: str,
    variant: str,
    text: str,
    params: dict[str, Any],
    repeat: int,
    *,
    generic: bool = False,
) -> None:
    explain(conn, text, params, generic=generic)  # warm-up
    runs = [explain(conn, text, params, generic=generic) for _ in range(repeat)]
    line = {
        "scenario": scenario,
        "case": case,
        "variant": variant,
        "ms": round(statistics.median(r[0] for r in runs), 3),
        "ms_range": [round(min(r[0] for r in runs), 3), round(max(r[0] for r in runs), 3)],
        "plan": runs[-1][1],
    }
    RESULTS.append(line)
    print(json.dumps(line), flush=True)


def new_list_workflows(given: dict[str, Any]) -> str:
    """What _storage/workflows.py builds for these filters (its fixed fragments)."""
    from dbos_agent._storage.workflows import _LIST_FILTERS

    filters = " AND ".join(f for key, f in _LIST_FILTERS.items() if key in given)
    return query("list_workflows").replace("{filters}", filters or "true")


def bench_list_workflows(server: str, n: int, repeat: int) -> None:
    url = filled(server, "list_workflows", fill_list_workflows, n)
    keys = ("status", "name", "executor_id", "queue_name", "created_after", "created_before")
    cases: dict[str, dict[str, Any]] = {
        "status=ERROR": {"status": "ERROR"},
        "name=job-3": {"name": "job-3"},
        "status=ERROR,name=job-7": {"status": "ERROR", "name": "job-7"},
        "executor_id=exec-2": {"executor_id": "exec-2"},
        "none": {},
    }
    with psycopg.connect(url) as conn:
        for case, given in cases.items():
            old = {k: given.get(k) for k in keys} | {"limit": 100}
            measure(
                conn, "list_workflows", case, "before_custom", BEFORE_LIST_WORKFLOWS, old, repeat
            )
            measure(
                conn,
                "list_workflows",
                case,
                "before_generic",
                BEFORE_LIST_WORKFLOWS,
                old,
                repeat,
                generic=True,
            )
            new = given | {"limit": 100}
            measure(conn, "list_workflows", case, "after", new_list_workflows(given), new, repeat)
            measure(
                conn,
                "list_workflows",
                case,
                "after_generic",
                new_list_workflows(given),
                new,
                repeat,
                generic=True,
            )


def bench_list_approvals(server: str, n: int, repeat: int) -> None:
    url = filled(server, "list_approvals", fill_list_approvals, n)
    with psycopg.connect(url) as conn:
        one = {"workflow_id": "wf-123", "limit": 100}
        pending = {"workflow_id": None, "limit": 100}
        for generic in (False, True):
            tag = "_generic" if generic else ""
            measure(
                conn,
                "list_approvals",
                "one workflow",
                "before" + tag,
                BEFORE_LIST_APPROVALS,
                one,
                repeat,
                generic=generic,
            )
            measure(
                conn,
                "list_approvals",
                "one workflow",
                "after" + tag,
                query("list_workflow_approvals"),
                one,
                repeat,
                generic=generic,
            )
            measure(
                conn,
                "list_approvals",
                "pending of all",
                "before" + tag,
                BEFORE_LIST_APPROVALS,
                pending,
                repeat,
                generic=generic,
            )
            measure(
                conn,
                "list_approvals",
                "pending of all",
                "after" + tag,
                query("list_pending_approvals"),
                {"limit": 100},
                repeat,
                generic=generic,
            )


@contextmanager
def live_locks(url: str) -> Iterator[None]:
    """The live sessions' advisory locks, held as their processes would."""
    with psycopg.connect(url, autocommit=True) as conn:
        for key in range(1, LIVE_SESSIONS + 1):
            conn.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, key))
        yield


def bench_claims(server: str, n: int, repeat: int) -> None:
    url = filled(server, "claims", fill_claims, n)
    from datetime import UTC, datetime

    claim = {
        "owner_key": 1,
        "executor_id": "exec-1",
        "orphans": True,
        "names": ["job"],
        "skip_ids": [],
        "app_version": None,
        "code_version": "c",
        "after_created_at": datetime(1970, 1, 1, tzinfo=UTC),
        "after_workflow_id": "",
        "limit": 100,
    }
    probe = {"owner_key": 1, "names": ["job"], "app_version": None, "code_version": "c"}
    with live_locks(url), psycopg.connect(url) as conn:
        for generic in (False, True):
            tag = "_generic" if generic else ""
            measure(
                conn,
                "claim_workflows",
                "50 orphans among 100k",
                "before" + tag,
                BEFORE_CLAIM_WORKFLOWS,
                claim,
                repeat,
                generic=generic,
            )
            measure(
                conn,
                "claim_workflows",
                "50 orphans among 100k",
                "after" + tag,
                query("claim_workflows"),
                claim,
                repeat,
                generic=generic,
            )
        with conn.transaction(force_rollback=True):  # nothing to take over: the idle pass
            conn.execute(
                "UPDATE dbos_agent.workflows SET owner_key = 1 WHERE workflow_id LIKE 'orphan-%%'"
            )
            for generic in (False, True):
                tag = "_generic" if generic else ""
                measure(
                    conn,
                    "probe_orphans",
                    "none among 100k",
                    "before" + tag,
                    BEFORE_PROBE_ORPHANS,
                    probe,
                    repeat,
                    generic=generic,
                )
                measure(
                    conn,
                    "probe_orphans",
                    "none among 100k",
                    "after" + tag,
                    query("probe_orphans"),
                    probe,
                    repeat,
                    generic=generic,
                )


def bench_family_usage(server: str, n: int, repeat: int) -> None:
    url = filled(server, "family", fill_family, n)
    params = {"workflow_id": "child-3", "names": ["dbos_agent.model"]}
    with psycopg.connect(url) as conn:
        measure(
            conn,
            "family_usage",
            f"{n} replies",
            "before",
            BEFORE_LIST_FAMILY_MODEL_USAGE,
            params,
            repeat,
        )
        measure(
            conn,
            "family_usage",
            f"{n} replies",
            "after",
            query("get_family_model_usage"),
            params,
            repeat,
        )
        for variant, text in (
            ("before", BEFORE_LIST_FAMILY_MODEL_USAGE),
            ("after", query("get_family_model_usage")),
        ):
            walls = []
            for _ in range(repeat + 1):
                started = time.perf_counter()
                rows = conn.execute(text, params).fetchall()  # type: ignore[arg-type]
                if variant == "before":  # what budget.py did with them
                    tokens = sum(sum(json.loads(u).values()) for _, u in rows)
                else:
                    tokens = sum(r[2] + r[3] + r[4] + r[5] for r in rows)
                walls.append((time.perf_counter() - started) * 1000)
            line = {
                "scenario": "family_usage",
                "case": f"{n} replies, read and summed in Python",
                "variant": variant,
                "ms": round(statistics.median(walls[1:]), 3),
                "ms_range": [round(min(walls[1:]), 3), round(max(walls[1:]), 3)],
                "plan": f"{len(rows)} rows, {tokens} tokens",
            }
            RESULTS.append(line)
            print(json.dumps(line), flush=True)


def bench_record_reply(server: str, n: int, repeat: int) -> None:
    url = filled(server, "record", fill_family, 10)
    reply = json.dumps(
        {
            "model": "claude-haiku-4-5",
            "content": [],
            "usage": {"input_tokens": 1000, "output_tokens": 100},
        }
    )
    count = 2000
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE dbos_agent.workflows SET owner_key = 1")
        conn.execute("SET synchronous_commit = off")
        seq = 1000
        for variant in ("before", "after", "before", "after"):  # interleaved: drift shows
            action = "DISABLE" if variant == "before" else "ENABLE"
            for trigger in ("steps_count_family_usage", "steps_count_family_usage_on_success"):
                conn.execute(f"ALTER TABLE dbos_agent.steps {action} TRIGGER {trigger}")  # type: ignore[arg-type]
            for kind, output in (("model reply", reply), ("no-op step", None)):
                # a commit each (as each checkpoint is), synchronous_commit off: the
                # statement's own cost, the trigger's included, without an fsync in each
                started = time.perf_counter()
                if True:
                    for _ in range(count):
                        seq += 1
                        conn.execute(
                            query("append_step"),
                            {
                                "workflow_id": "child-1",
                                "seq": seq,
                                "name": "dbos_agent.model",
                                "status": "SUCCESS",
                                "output": output,
                                "error": None,
                                "attempts": 1,
                                "started_at": "now",
                                "owner_key": 1,
                            },
                        )
                us = (time.perf_counter() - started) / count * 1e6
                line = {
                    "scenario": "record_reply",
                    "case": kind,
                    "variant": variant,
                    "us_per_step": round(us, 1),
                    "plan": "append_step, autocommit, synchronous_commit off",
                }
                RESULTS.append(line)
                print(json.dumps(line), flush=True)


SCENARIOS = {
    "list_workflows": bench_list_workflows,
    "list_approvals": bench_list_approvals,
    "claim_workflows": bench_claims,
    "family_usage": bench_family_usage,
    "record_reply": bench_record_reply,
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dsn", required=True, help="Postgres URL or conninfo of the server to use")
    ap.add_argument("--rows", type=int, default=100_000, help="rows per scenario")
    ap.add_argument("--repeat", type=int, default=7, help="runs per measurement (median)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    a = ap.parse_args()
    with psycopg.connect(a.dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    print(
        json.dumps(
            {
                "scenario": "meta",
                "postgres": version and version[0],
                "python": sys.version.split()[0],
                "rows": a.rows,
                "repeat": a.repeat,
            }
        )
    )
    for name in a.scenarios.split(","):
        SCENARIOS[name](a.dsn, a.rows, a.repeat)
    print("\n| scenario | case | variant | median ms (µs/step) | plan |\n|---|---|---|---|---|")
    for r in RESULTS:
        figure = r.get("ms", r.get("us_per_step"))
        print(f"| {r['scenario']} | {r['case']} | {r['variant']} | {figure} | {r['plan']} |")


if __name__ == "__main__":
    main()
