#!/usr/bin/env python3
"""Fleet benchmark: many worker processes on one Postgres (issue 4's figures).

    python bench/bench_fleet.py --dsn postgresql://postgres@127.0.0.1:55432/postgres

Scenarios (``--scenarios``, default both):

  orphans   10,000 workflows of 10 no-op steps are left PENDING after step 0 by a
            "victim" executor whose process then dies (kill -9; lease 1 s). Two
            worker daemons (``python -m dbos_agent.worker --app bench.fleet_app``)
            start; timed from their start until all 10,000 are SUCCESS (9 steps
            each remain). Reports workflows/s and steps/s of take-over.
  queue     N (default 5,000) one-step workflows are enqueued by a client; four
            worker daemons start; timed from their start until all are SUCCESS.
            Reports the enqueue rate and the dispatch throughput (workflows/s).

Each run uses its own database ``dbos_agent_bench_fleet`` (dropped and created).
Prints one JSON line per scenario. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "dbos_agent_bench_fleet"


def fresh_db(server: str) -> str:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB_NAME))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    info = psycopg.conninfo.conninfo_to_dict(server)
    info["dbname"] = DB_NAME
    return psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]


def env_for(url: str, **extra: str) -> dict[str, str]:
    return dict(os.environ, DBOS_AGENT_DATABASE_URL=url, PYTHONPATH=str(ROOT), **extra)


def count(url: str, status: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dbos_agent.workflows WHERE status = %s", (status,)
        ).fetchone()
    return int(row[0]) if row else 0


def start_workers(url: str, n: int, *args: str) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dbos_agent.worker",
                "--app",
                "bench.fleet_app",
                "--quiet",
                "--poll",
                "0.2",
                *args,
            ],
            env=env_for(url),
            cwd=ROOT,
        )
        for _ in range(n)
    ]


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        try:
            w.wait(60)
        except subprocess.TimeoutExpired:
            w.kill()


def wait_all(url: str, total: int, timeout: float) -> float:
    started = time.perf_counter()
    while count(url, "SUCCESS") < total:
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"only {count(url, 'SUCCESS')} of {total} finished")
        time.sleep(0.05)
    return time.perf_counter() - started


VICTIM = """
import sys, concurrent.futures as cf
import dbos_agent as da
from bench.fleet_app import fleet_job, Abandon
n = int(sys.argv[1])
rt = da.launch(executor_id="victim", lease_seconds=1.0, recover=False, run_queues=False)
def one(i):
    try:
        with da.workflow_id(f"orphan-{i:05d}"):
            fleet_job(10)
    except Abandon:
        pass
with cf.ThreadPoolExecutor(8) as ex:
    list(ex.map(one, range(n)))
print("ready", flush=True)
sys.stdin.read()
"""


def scenario_orphans(server: str, n: int) -> dict[str, object]:
    url = fresh_db(server)
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(n)],
        env=env_for(url, FLEET_ABANDON_AFTER_FIRST="1"),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert victim.stdout is not None
    assert victim.stdout.readline().strip() == b"ready"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert count(url, "PENDING") == n
    time.sleep(1.2)  # the victim's lease runs out
    workers = start_workers(url, 2, "--workers", "16")
    try:
        seconds = wait_all(url, n, 600)
    finally:
        stop_workers(workers)
    return {
        "scenario": "orphan_takeover",
        "workflows": n,
        "workers": 2,
        "seconds": round(seconds, 3),
        "wf_per_s": round(n / seconds, 1),
        "steps_per_s": round(9 * n / seconds, 1),
    }


def scenario_queue(server: str, n: int) -> dict[str, object]:
    url = fresh_db(server)
    sys.path.insert(0, str(ROOT))
    import dbos_agent as da

    with da.Client(url, pool_size=8) as client:
        t0 = time.perf_counter()
        for i in range(n):
            client.enqueue("bench-fleet", "fleet_job", 1, workflow_id=f"queued-{i:05d}")
        enqueue_s = time.perf_counter() - t0
    workers = start_workers(url, 4, "--workers", "16")
    try:
        seconds = wait_all(url, n, 600)
    finally:
        stop_workers(workers)
    return {
        "scenario": "queue_dispatch",
        "workflows": n,
        "workers": 4,
        "enqueue_per_s": round(n / enqueue_s, 1),
        "seconds": round(seconds, 3),
        "wf_per_s": round(n / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True, help="a Postgres server URL")
    parser.add_argument("--scenarios", default="orphans,queue")
    parser.add_argument("--orphans", type=int, default=10_000)
    parser.add_argument("--queued", type=int, default=5_000)
    args = parser.parse_args()
    for name in args.scenarios.split(","):
        if name == "orphans":
            result = scenario_orphans(args.dsn, args.orphans)
        elif name == "queue":
            result = scenario_queue(args.dsn, args.queued)
        else:
            parser.error(f"unknown scenario {name!r}")
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
