#!/usr/bin/env python3
"""Deploy-check benchmark: ``dbos-agent check-deploy`` over many in-flight workflows.

    python bench/bench_check_deploy.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python bench/bench_check_deploy.py --dsn ... --workflows 1000   # a quick check

The database ``dbos_agent_bench_check`` on the DSN's server is dropped and created and
filled (INSERT ... SELECT generate_series, then VACUUM ANALYZE) with ``--workflows``
(default 10,000) SUSPENDED agents of ``bench/check_app.py``, each with ``--steps``
(default 20) recorded tool steps and the intent of the recv it waits in: what a
production database holds while agents wait for approvals.

Scenarios (one JSON line each, after a ``meta`` line), each ``--repeat`` times:

  read_logs   the floor: one process reads the same workflows and logs, page by page
              (``list_workflows_to_check`` + ``load_steps_of_many``, 500 a page) and
              does nothing with them: seconds, peak RSS.
  check       ``python -m dbos_agent check-deploy --app bench.check_app --json`` as a
              child process: seconds, workflows/s, ms per workflow and per replayed
              step, peak RSS (``wait4``: the larger of the command's and that of the
              process it checks the app in), and the ratio to ``read_logs``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "dbos_agent_bench_check"

FILL = [
    """INSERT INTO dbos_agent.workflows
        (workflow_id, name, status, inputs, executor_id, max_recovery_attempts,
         wait_kind, wait_target, wait_name, created_at)
    SELECT 'check-' || i, 'bench_check.agent', 'SUSPENDED',
           jsonb_build_object('task', 'task ' || i, 'turns', %(steps)s),
           'bench-check-fill', 50, 'recv', 'check-' || i, 'approve',
           now() - interval '1 day' + i * interval '1 ms'
    FROM generate_series(0, %(n)s - 1) AS i""",
    """INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, output, attempts, started_at, finished_at)
    SELECT 'check-' || i, seq, 'bench_check.tool', 'SUCCESS',
           jsonb_build_object('turn', seq, 'text', 'ok'), 1, now(), now()
    FROM generate_series(0, %(n)s - 1) AS i, generate_series(0, %(steps)s - 1) AS seq""",
    """INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, inputs, attempts, started_at, finished_at)
    SELECT 'check-' || i, %(steps)s, 'dbos_agent.recv', 'PENDING',
           '{"topic": "approve", "deadline": null}', 1, now(), NULL
    FROM generate_series(0, %(n)s - 1) AS i""",
]


def database_url(dsn: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=DB_NAME)


def fresh_database(dsn: str, workflows: int, steps: int) -> float:
    """Drop, create, migrate and fill the bench database; seconds the fill took."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB_NAME)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    url = database_url(dsn)
    subprocess.run(
        [sys.executable, "-m", "dbos_agent", "--database-url", url, "migrate"],
        check=True,
        capture_output=True,
    )
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for statement in FILL:
            conn.execute(statement, {"n": workflows, "steps": steps})
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


READ_LOGS = """
import sys, time, resource
from dbos_agent._storage.database import SystemDatabase
db = SystemDatabase(sys.argv[1], pool_size=2, read_only=True)
db.open()
started, after, n, steps = time.perf_counter(), None, 0, 0
while True:
    page = db.histories.to_check(["bench_check.agent"], after, 500)
    n += len(page)
    steps += sum(len(h.steps) for h in page)
    if len(page) < 500:
        break
    after = (page[-1].created_at, page[-1].workflow_id)
print(n, steps, time.perf_counter() - started)
"""


def child(argv: list[str]) -> tuple[str, float, float]:
    """Run a child process: its stdout, wall seconds, and its peak RSS in MB (its own or
    that of a process it started and waited for, whichever is larger: wait4's)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage, not every child's
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"child {argv[:4]} failed ({proc.returncode})")
    return out, seconds, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--workflows", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    print(json.dumps({"scenario": "meta", "head": head, "workflows": args.workflows,
                      "steps": args.steps, "cpus": os.cpu_count()}), flush=True)  # fmt: skip
    fill = fresh_database(args.dsn, args.workflows, args.steps)
    print(json.dumps({"scenario": "fill", "seconds": round(fill, 2)}), flush=True)
    url = database_url(args.dsn)
    floor, checks = [], []
    n_steps = args.workflows * (args.steps + 1)
    for _ in range(args.repeat):
        out, seconds, rss = child([sys.executable, "-c", READ_LOGS, url])
        n, steps, read_seconds = out.split()
        assert int(n) == args.workflows and int(steps) == n_steps, out
        floor.append((seconds, float(read_seconds), rss))
        check_deploy = ["check-deploy", "--app", "bench.check_app", "--json"]
        out, seconds, rss = child(
            [sys.executable, "-m", "dbos_agent", "--database-url", url, *check_deploy]
        )
        report = json.loads(out)
        assert report["checked"] == args.workflows and report["fits"], report
        checks.append((seconds, rss))
    read = statistics.median(f[0] for f in floor)
    print(json.dumps({
        "scenario": "read_logs",
        "seconds": round(read, 3),
        "query_seconds": round(statistics.median(f[1] for f in floor), 3),
        "peak_rss_mb": round(statistics.median(f[2] for f in floor), 1),
    }), flush=True)  # fmt: skip
    check = statistics.median(c[0] for c in checks)
    print(json.dumps({
        "scenario": "check",
        "seconds": round(check, 3),
        "seconds_range": [round(min(c[0] for c in checks), 3), round(max(c[0] for c in checks), 3)],
        "workflows_per_s": round(args.workflows / check),
        "ms_per_workflow": round(1000 * check / args.workflows, 3),
        "us_per_step": round(1e6 * check / (args.workflows * (args.steps + 1)), 1),
        "peak_rss_mb": round(statistics.median(c[1] for c in checks), 1),
        "vs_read_logs": round(check / read, 2),
    }), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
