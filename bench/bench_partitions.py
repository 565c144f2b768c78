#!/usr/bin/env python3
"""Partition fairness: how long small tenants wait while one tenant's burst drains.

    python bench/bench_partitions.py                       # its own throwaway cluster
    python bench/bench_partitions.py --dsn postgresql://postgres@127.0.0.1:55432/postgres

One process (``da.launch``, ``--workers`` slots) serves one queue. The big tenant's
``--big`` (10,000) workflows are recorded ENQUEUED in one INSERT ... SELECT; right after,
``--tenants`` (50) small tenants enqueue ``--each`` (10) workflows each through
``Queue.enqueue``, interleaved. Every workflow runs one step that sleeps ``--work-ms``.
A small workflow's wait is ``dequeued_at - created_at`` (both on the database's clock).

Scenarios (one JSON line each, after a ``meta`` line):

  partitioned  ``Queue(..., partitioned=True)``, each tenant its partition_key: the
               partitions are served in turn, so a small tenant waits for about one
               turn of every partition, not for the big tenant's backlog.
  fifo         the same load on a queue that is not partitioned (oldest first), for
               contrast: the small tenants wait for the backlog ahead of them.

Each line: the small tenants' wait p50/p99/max (ms), how many of the big tenant's had
started when the last small one started, and the seconds until every small one finished.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import psycopg

import dbos_agent as da
from dbos_agent._engine.queues import isolated_queues
from dbos_agent._engine.workflow import definition_of
from dbos_agent.testing.databases import scratch_database

WORK_SECONDS = 0.005


@da.step(name="bench_partitions.work")
def work(tenant: str) -> str:
    time.sleep(WORK_SECONDS)
    return tenant


@da.durable_workflow(name="bench_partitions.job")
def job(tenant: str) -> str:
    return work(tenant)


BIG_INSERT = """
INSERT INTO dbos_agent.workflows
    (workflow_id, name, status, inputs, executor_id, max_recovery_attempts, queue_name,
     partition_key, created_at)
SELECT %(prefix)s || i, %(name)s, 'ENQUEUED', %(inputs)s::jsonb, 'bench', 50, %(queue)s,
       %(partition_key)s, clock_timestamp()
FROM generate_series(1, %(n)s) AS i
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def scenario(url: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    partitioned = name == "partitioned"
    queue_name = f"bench-{name}"
    with isolated_queues():
        queue = da.Queue(queue_name, partitioned=partitioned)
        with da.launch(url, executor_id=f"bench-{name}", workers=args.workers):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    BIG_INSERT,
                    {
                        "prefix": f"{name}-big-",
                        "name": definition_of(job).name,
                        "inputs": definition_of(job).inputs.dumps(("big",), {}),
                        "queue": queue_name,
                        "partition_key": "big" if partitioned else None,
                        "n": args.big,
                    },
                )
            started = time.monotonic()
            small = []
            for i in range(args.each):
                for t in range(args.tenants):
                    tenant = f"small-{t:02d}"
                    key = tenant if partitioned else None
                    small.append(
                        queue.enqueue(
                            job, tenant, workflow_id=f"{name}-{tenant}-{i}", partition_key=key
                        )
                    )
            enqueue_seconds = time.monotonic() - started
            for handle in small:
                handle.result(600)
            finished = time.monotonic() - started
            with psycopg.connect(url) as conn:
                waits = [
                    row[0]
                    for row in conn.execute(
                        "SELECT extract(epoch FROM dequeued_at - created_at) * 1000"
                        " FROM dbos_agent.workflows WHERE workflow_id LIKE %s",
                        (f"{name}-small-%",),
                    )
                ]
                last = conn.execute(
                    "SELECT max(dequeued_at) FROM dbos_agent.workflows WHERE workflow_id LIKE %s",
                    (f"{name}-small-%",),
                ).fetchone()
                big_before = conn.execute(
                    "SELECT count(*) FROM dbos_agent.workflows"
                    " WHERE workflow_id LIKE %s AND dequeued_at <= %s",
                    (f"{name}-big-%", last[0] if last else None),
                ).fetchone()
    waits = [float(w) for w in waits]
    return {
        "scenario": name,
        "small_workflows": len(waits),
        "wait_ms_p50": round(statistics.median(waits), 1),
        "wait_ms_p99": round(percentile(waits, 0.99), 1),
        "wait_ms_max": round(max(waits), 1),
        "big_started_before_last_small": int(big_before[0]) if big_before else None,
        "small_enqueue_s": round(enqueue_seconds, 2),
        "all_small_done_s": round(finished, 2),
    }


def main() -> int:
    global WORK_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="a Postgres server (default: a throwaway local one)")
    parser.add_argument("--big", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--each", type=int, default=10)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--work-ms", type=float, default=5.0)
    parser.add_argument("--scenarios", default="partitioned,fifo")
    args = parser.parse_args()
    WORK_SECONDS = args.work_ms / 1000
    meta = {k: v for k, v in vars(args).items() if k != "dsn"}
    print(json.dumps({"meta": meta}), flush=True)
    for name in args.scenarios.split(","):
        with scratch_database(args.dsn) as url:
            print(json.dumps(scenario(url, name, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
