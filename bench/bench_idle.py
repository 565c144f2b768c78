#!/usr/bin/env python3
"""What an idle launched process costs the database: statements per second, by purpose.

    python bench/bench_idle.py --dsn postgresql://postgres@127.0.0.1:55432/postgres

A child process launches on the database ``dbos_agent_bench_idle`` (fresh) with a
workflow registered and nothing to do, and counts every statement the library sends
through its pool (``Connector.run``, by what it does) over ``--seconds`` (default 30),
after a warm-up; the heartbeat (its own connection, at most once a second) and the
LISTEN connection are not pooled and are reported apart. It runs once with the defaults
(take-over on) and once with ``launch(take_over=False)``: the difference is what failover
in every process costs an idle process (the target: under one statement per second).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "dbos_agent_bench_idle"

CHILD = """
import collections, json, sys, time
import dbos_agent as da
from dbos_agent._storage.connector import Connector

counts = collections.Counter()
original = Connector.run
def counted(self, what, body, **kw):
    counts[what] += 1
    return original(self, what, body, **kw)
Connector.run = counted

@da.durable_workflow
def idle_flow(x: int) -> int:
    return x

url, take_over, seconds = sys.argv[1], sys.argv[2] == "on", float(sys.argv[3])
with da.launch(url, executor_id="bench-idle", take_over=take_over) as rt:
    rt.wait_for_recovery(30)
    time.sleep(3)  # warm-up: recovery at launch, the first sweeps
    counts.clear()
    time.sleep(seconds)
    snapshot = dict(counts)
print(json.dumps(snapshot))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB_NAME)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    url = psycopg.conninfo.make_conninfo(args.dsn, dbname=DB_NAME)
    rates = {}
    for mode in ("on", "off"):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, url, mode, str(args.seconds)],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        counts = json.loads(out.strip().splitlines()[-1])
        total = sum(counts.values())
        rates[mode] = total / args.seconds
        print(json.dumps({
            "scenario": f"idle_take_over_{mode}",
            "statements_per_s": round(total / args.seconds, 3),
            "by_purpose_per_s": {k: round(v / args.seconds, 3) for k, v in sorted(counts.items())},
        }), flush=True)  # fmt: skip
    print(json.dumps({
        "scenario": "take_over_cost",
        "statements_per_s": round(rates["on"] - rates["off"], 3),
    }), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
