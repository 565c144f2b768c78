#!/usr/bin/env python3
"""Retention benchmark: garbage_collect over a large backlog, alone and under load.

    python bench/bench_gc.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python bench/bench_gc.py --dsn ... --workflows 50000 --baseline 5   # a quick check

The database ``dbos_agent_bench_gc`` on the DSN's server is dropped and created, and
filled with ``--workflows`` (default 1,000,000) finished workflows made 30 days old,
each with 2 steps, 1 message and 1 event (90 % SUCCESS, 5 % ERROR, 5 % CANCELLED), by
INSERT ... SELECT generate_series, 100,000 workflows per committed transaction, then
VACUUM ANALYZE (what autovacuum would have done by the time anything is 30 days old).

Scenarios (one JSON line each, after a ``meta`` line):

  fill          how long the fill took (rows/s), for the record.
  gc_alone      ``da.operations.garbage_collect(timedelta(days=1))`` with the default batch size
                deletes the whole backlog, nothing else running: seconds, batches,
                workflows/s and rows/s (workflows + steps + messages + events).
  gc_under_load the backlog is filled again; ``--threads`` (4) threads run durable
                workflows of 5 no-op steps back to back through ``da.launch(dsn)``.
                Their rate (workflows/s) and per-workflow latency (p50/p99 ms) over a
                ``--baseline`` window (10 s) without GC, then over the time the same
                garbage_collect takes while they run; plus the GC's own figures.

The workload's workflows are new, so retention never deletes them: they meet the
collector only through the server (CPU, I/O, WAL, locks of the index pages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta

import psycopg
from psycopg import sql

import dbos_agent as da

DB_NAME = "dbos_agent_bench_gc"
FILL_BATCH = 100_000
AGE = timedelta(days=1)

FILL = [
    """INSERT INTO dbos_agent.workflows
        (workflow_id, name, status, inputs, output, error, executor_id, max_recovery_attempts,
         created_at, updated_at, finished_at)
    SELECT 'gc-' || i, 'bench_gc.job',
           CASE i %% 20 WHEN 0 THEN 'ERROR' WHEN 1 THEN 'CANCELLED' ELSE 'SUCCESS' END,
           '{"n": 5}',
           CASE WHEN i %% 20 > 1 THEN '5'::jsonb END,
           CASE WHEN i %% 20 <= 1
                THEN '{"type": "builtins.RuntimeError", "message": "x", "args": []}'::jsonb END,
           'bench-gc-fill', 50,
           t, t + interval '50 ms', t + interval '50 ms'
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i,
         LATERAL (SELECT now() - interval '30 days' + i * interval '1 ms' AS t) AS at""",
    """INSERT INTO dbos_agent.steps
        (workflow_id, seq, name, status, output, attempts, started_at, finished_at)
    SELECT 'gc-' || i, seq, 'bench_gc.noop', 'SUCCESS', 'null', 1,
           now() - interval '30 days', now() - interval '30 days'
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i, generate_series(0, 1) AS seq""",
    """INSERT INTO dbos_agent.messages (destination_id, message)
    SELECT 'gc-' || i, '"hello"' FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i""",
    """INSERT INTO dbos_agent.events (workflow_id, key, value)
    SELECT 'gc-' || i, 'progress', '"done"'
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i""",
]
TABLES = ("workflows", "steps", "messages", "events")


@da.step
def noop() -> None:
    return None


@da.durable_workflow
def wf_steps(n: int) -> int:
    for _ in range(n):
        noop()
    return n


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def fresh_db(server):
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB_NAME))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
        version = conn.execute("SHOW server_version").fetchone()[0]
    info = psycopg.conninfo.conninfo_to_dict(server)
    info["dbname"] = DB_NAME
    return psycopg.conninfo.make_conninfo(**info), version


def fill(url, n):
    """n old finished workflows with their rows; returns the fill's JSON line."""
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for lo in range(0, n, FILL_BATCH):
            for statement in FILL:
                conn.execute(statement, {"lo": lo, "hi": min(n, lo + FILL_BATCH)})
            conn.commit()
    inserted = time.perf_counter() - started
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(sql.SQL("VACUUM ANALYZE dbos_agent.{}").format(sql.Identifier(table)))
        counts = [
            conn.execute(
                sql.SQL("SELECT count(*) FROM dbos_agent.{}").format(sql.Identifier(table))
            ).fetchone()[0]
            for table in TABLES
        ]
    return {
        "scenario": "fill",
        "workflows": n,
        "rows": sum(counts),
        "insert_s": round(inserted, 2),
        "rows_per_s": round(sum(counts) / inserted),
        "vacuum_analyze_s": round(time.perf_counter() - started - inserted, 2),
    }


def gc_figures(report):
    rows = report.workflows + report.steps + report.messages + report.events
    return {
        "deleted_workflows": report.workflows,
        "deleted_rows": rows,
        "batches": report.batches,
        "gc_s": round(report.seconds, 2),
        "gc_workflows_per_s": round(report.workflows / report.seconds),
        "gc_rows_per_s": round(rows / report.seconds),
        "batch_ms": round(report.seconds / max(1, report.batches) * 1000, 1),
    }


def collect(expected):
    report = da.operations.garbage_collect(AGE)
    if report.workflows != expected:
        sys.exit(f"garbage_collect deleted {report.workflows} workflows, expected {expected}")
    return report


class Workload:
    """``threads`` threads running 5-step workflows back to back; each finish is logged
    as (time it ended, latency)."""

    def __init__(self, threads, steps):
        self.steps = steps
        self.done = []  # (end, latency); list.append is atomic
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]

    def run(self):
        while not self.stop.is_set():
            started = time.perf_counter()
            with da.workflow_id(f"load-{uuid.uuid4().hex}"):
                wf_steps(self.steps)
            ended = time.perf_counter()
            self.done.append((ended, ended - started))

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def window(self, start, end):
        lat = [latency * 1000 for ended, latency in self.done if start <= ended < end]
        if not lat:
            return {"workflows": 0}
        return {
            "workflows": len(lat),
            "wf_per_s": round(len(lat) / (end - start), 1),
            "p50_ms": round(statistics.median(lat), 2),
            "p99_ms": round(pct(lat, 99), 2),
        }


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dsn", required=True, help="Postgres URL or conninfo of the server to use")
    ap.add_argument("--workflows", type=int, default=1_000_000, help="backlog to delete")
    ap.add_argument("--threads", type=int, default=4, help="workload threads (gc_under_load)")
    ap.add_argument("--steps", type=int, default=5, help="no-op steps per workload workflow")
    ap.add_argument("--baseline", type=float, default=10.0, help="seconds of load without GC")
    a = ap.parse_args()

    url, version = fresh_db(a.dsn)
    print(
        json.dumps(
            {
                "scenario": "meta",
                "postgres": version,
                "python": sys.version.split()[0],
                "psycopg": psycopg.__version__,
                "cpus": os.cpu_count(),
                "workflows": a.workflows,
            }
        ),
        flush=True,
    )
    runtime = da.launch(url, executor_id=f"bench-gc-{uuid.uuid4().hex[:8]}", workers=a.threads)
    try:
        print(json.dumps(fill(url, a.workflows)), flush=True)
        alone = collect(a.workflows)
        print(json.dumps({"scenario": "gc_alone", **gc_figures(alone)}), flush=True)

        fill(url, a.workflows)
        with Workload(a.threads, a.steps) as load:
            time.sleep(1.0)  # warm up: connections, first plans
            base_start = time.perf_counter()
            time.sleep(a.baseline)
            gc_start = time.perf_counter()
            under_load = collect(a.workflows)
            gc_end = time.perf_counter()
        baseline = load.window(base_start, gc_start)
        during = load.window(gc_start, gc_end)
        result = {
            "scenario": "gc_under_load",
            "threads": a.threads,
            "steps_per_wf": a.steps,
            **gc_figures(under_load),
            **{f"baseline_{k}": v for k, v in baseline.items()},
            **{f"during_gc_{k}": v for k, v in during.items()},
        }
        if baseline.get("wf_per_s") and during.get("wf_per_s"):
            result["wf_per_s_ratio"] = round(during["wf_per_s"] / baseline["wf_per_s"], 3)
        print(json.dumps(result), flush=True)
    finally:
        runtime.shutdown(grace=5)


if __name__ == "__main__":
    main()
