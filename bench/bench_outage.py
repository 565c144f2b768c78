#!/usr/bin/env python3
"""Waiting out a model outage costs what waiting in recv costs: N agents, one worker.

    python bench/bench_outage.py --dsn postgresql://postgres@127.0.0.1:55432/postgres \
        --n 10000 --outage 60

Phases, each measured from outside the worker process (its peak RSS and threads read
from /proc every 0.2 s, the workflows' states from the database):

1. recv: a worker (``launch(workers=16)``, the same process as phase 2's, imports
   included) starts N workflows that each wait in ``da.recv``; time until all N are
   SUSPENDED, the worker's peak RSS and threads.
2. outage: a fresh worker starts N agents, each one model call (``Model(retries=0,
   interval=5, max_interval=60)``) to a scripted Messages API answering 529 to every
   request; time until all N wait SUSPENDED for the model API, then ``--outage`` seconds
   more of the outage, during which the agents keep waking, failing and waiting again
   (each wake a replay, one request and one statement); the worker's peak RSS and
   threads over the whole phase, and the requests the server answered.
3. back: the outage ends and ``dbos-agent retry`` is not used: the agents come back by
   themselves at their next attempt (up to ``max_interval`` later); time until all N
   finished, and the replies paid (each exactly once).

It uses the database ``dbos_agent_bench_outage`` on the DSN's server, dropped and
created at start. One JSON line per phase, then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_suspension as parking

import dbos_agent as da
from dbos_agent.agent import Model
from dbos_agent.agent.scripted_server import Fail, Reply, ScriptedServer, ScriptItem, text

DB_NAME = "dbos_agent_bench_outage"
WORKERS = 16


@da.durable_workflow(name="bench_outage_agent")
def agent(i: int) -> str:
    reply = MODEL[0].create([{"role": "user", "content": f"agent {i}"}])
    return "".join(block.text for block in reply.content if block.type == "text")


@da.durable_workflow(name="bench_outage_parked")
def parked(i: int) -> str:
    return str(da.recv("go", timeout=None))


MODEL: list[Model] = []


def child(kind: str, url: str, model_url: str, prefix: str, n: int) -> None:
    """Launch a worker, start ``n`` agents on the model at ``model_url`` (``kind`` agents)
    or ``n`` workflows waiting in recv (``recv``: the same process, the same imports),
    then serve until killed."""
    MODEL.append(
        Model(
            anthropic.Anthropic(base_url=model_url, api_key="x"),
            retries=0,
            interval=5.0,
            max_interval=60.0,
        )
    )
    rt = da.launch(url, executor_id=f"bench-{os.getpid()}", workers=WORKERS)
    for i in range(n):
        while len(rt.running()) > 2000:  # keep the backlog of starts bounded
            time.sleep(0.01)
        da.start(agent if kind == "agents" else parked, i, workflow_id=f"{prefix}-{i}")
    print("started", flush=True)
    threading.Event().wait()


class Outage:
    """529 to every request while ``down``; a short reply after."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.down.set()

    def __call__(self, body: dict[str, Any]) -> ScriptItem:
        if self.down.is_set():
            return Fail(529, message="overloaded")
        return Reply([text("done")])


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        text=True,
    )


def retrying(url: str, prefix: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dbos_agent.workflows"
            " WHERE status = 'SUSPENDED' AND wait_kind = 'retry' AND workflow_id LIKE %s",
            (prefix + "-%",),
        ).fetchone()
    return int(row[0]) if row else 0


def recv_phase(url: str, n: int) -> dict[str, Any]:
    started = time.monotonic()
    worker = spawn("recv", url, "http://127.0.0.1:9", "recv", str(n))
    sampler = parking.Sampler(worker.pid)
    parking.wait_for(lambda: parking.count(url, "SUSPENDED", "recv") >= n, 3600, "parked")
    park_s = time.monotonic() - started
    time.sleep(2)  # as long settled as the outage phase is measured after all wait
    sampler.stop()
    parking.kill(worker)
    return {
        "phase": "recv",
        "n": n,
        "all_waiting_s": round(park_s, 2),
        "worker_peak_rss_mb": sampler.rss,
        "worker_peak_threads": sampler.threads,
    }


def outage_phase(url: str, n: int, outage_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    script = Outage()
    with ScriptedServer(script) as server:
        started = time.monotonic()
        worker = spawn("agents", url, server.url, "out", str(n))
        sampler = parking.Sampler(worker.pid)
        parking.wait_for(lambda: retrying(url, "out") >= n, 3600, f"{n} waiting for the model")
        waiting_s = time.monotonic() - started
        time.sleep(outage_s)  # the outage goes on: wakes, failures, waits
        threads_now = parking.proc_status(worker.pid).get("Threads", 0)
        sampler.stop()
        during = {
            "phase": "outage",
            "n": n,
            "all_waiting_s": round(waiting_s, 2),
            "outage_s": outage_s,
            "worker_peak_rss_mb": sampler.rss,
            "worker_peak_threads": sampler.threads,
            "worker_threads_at_end": threads_now,
            "requests_answered_529": len(server.requests),
        }
        script.down.clear()
        back_started = time.monotonic()
        parking.wait_for(lambda: parking.count(url, "SUCCESS", "out") >= n, 3600, f"{n} done")
        after = {
            "phase": "back",
            "n": n,
            "all_done_s": round(time.monotonic() - back_started, 2),
            "paid": server.paid_calls,
        }
        parking.kill(worker)
    return during, after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:55432/postgres")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--outage", type=float, default=60.0, help="seconds of outage")
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child:
        kind, url, model_url, prefix, n = args.child
        child(kind, url, model_url, prefix, int(n))
        return 0

    admin = conninfo_to_dict(args.dsn)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")
    url = make_conninfo(**{**admin, "dbname": DB_NAME})
    with da.Client(url):  # the schema
        pass

    recv = recv_phase(url, args.n)
    during, after = outage_phase(url, args.n, args.outage)
    rows = [recv, during, after]
    for row in rows:
        print(json.dumps(row), flush=True)
    print()
    print("| phase | n | time to all waiting | peak RSS MB | peak threads | notes |")
    print("|---|---|---|---|---|---|")
    print(
        f"| recv | {recv['n']} | {recv['all_waiting_s']} s | {recv['worker_peak_rss_mb']} | "
        f"{recv['worker_peak_threads']} | |"
    )
    print(
        f"| model outage | {during['n']} | {during['all_waiting_s']} s | "
        f"{during['worker_peak_rss_mb']} | {during['worker_peak_threads']} | "
        f"{during['outage_s']} s more of outage, {during['requests_answered_529']} requests "
        f"answered 529; back: all done {after['all_done_s']} s after, {after['paid']} paid |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
