#!/usr/bin/env python3
"""What going through a transaction pooler costs in time (issue 33): wake-up latency and
take-over time, directly and through pgbouncer in transaction mode.

    python bench/bench_pooler.py                      # its own server and pgbouncer
    python bench/bench_pooler.py --scenarios wake --wake-n 50

Three ways of running a process:

  direct        the database URL is the server's: the session holds its advisory lock,
                a connection LISTENs.
  one-url       only a pooled URL (``?pooler=transaction``): the session is judged by its
                lease alone (``lease_only``), nothing LISTENs, waiters and the waker poll
                every ``poll_interval`` (1 s).
  session-url   the pooled URL for statements, the server's own as ``session_url``: the
                lock and LISTEN go there.

Scenarios (``--scenarios``, default both):

  wake      a workflow waits in ``recv``; a client sends it a message (at a random moment
            of a second after the wait began, so at any phase of a poll): the time from
            the send to the workflow's result, ``--wake-n`` times each (a
            wait held in memory, ``suspend_after`` high) and for a suspended wait
            (``suspend_after=0``, woken by the waker): p50, p90, max in ms.
  takeover  a process owning a workflow that waits in ``recv`` is killed -9; a peer
            (take-over pass every 0.5 s) takes it over. Timed from the kill until the peer
            owns the workflow, ``--takeover-n`` times each, for a peer on another host
            (the dead process's pid cannot be checked: it registered no process key, as
            where the platform cannot say) with ``--lease`` (default 10 s) and the default
            ``session_grace`` (3 s); on the same host the pid check ends it at once either
            way.

Each way runs on a fresh database of a throwaway server (``max_connections=100``) with a
pgbouncer (transaction mode) in front of it. Prints one JSON line per way and scenario.
Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dbos_agent as da  # noqa: E402
from dbos_agent.postgres.opening import open_system_database  # noqa: E402
from dbos_agent.postgres.pgbouncer import Pgbouncer  # noqa: E402
from dbos_agent.postgres.throwaway import LocalCluster  # noqa: E402
from dbos_agent.testing import fresh_database  # noqa: E402

WAYS = ("direct", "one-url", "session-url")


@da.durable_workflow
def waiter() -> str:
    return str(da.recv("go", timeout=600))


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(ms), 1),
        "p90_ms": round(_pct(ms, 90), 1),
        "max_ms": round(max(ms), 1),
    }


def _urls(way: str, direct: str, bouncer: Pgbouncer) -> tuple[str, str | None]:
    """(database_url, session_url) of a process run ``way``."""
    if way == "direct":
        return direct, None
    return bouncer.pooled_url(direct), direct if way == "session-url" else None


def wake(way: str, direct: str, bouncer: Pgbouncer, n: int) -> dict[str, object]:
    url, session_url = _urls(way, direct, bouncer)
    out: dict[str, object] = {"scenario": "wake", "way": way, "n": n}
    for kind, suspend_after in (("in_memory", 600.0), ("suspended", 0.0)):
        rt = da.launch(
            url, session_url=session_url, executor_id=f"wake-{way}", suspend_after=suspend_after
        )
        ms: list[float] = []
        try:
            with da.Client(url, pool_size=2) as client:
                for i in range(n):
                    wid = f"wake-{way}-{kind}-{i}"
                    handle = da.start(waiter, workflow_id=wid)
                    while not da.operations.list_steps(wid):  # it waits in recv
                        time.sleep(0.01)
                    if kind == "suspended":
                        while handle.status() is not da.WorkflowStatus.SUSPENDED:
                            time.sleep(0.01)
                    time.sleep(random.uniform(0.05, 1.05))  # at any phase of a 1 s poll
                    sent = time.perf_counter()
                    client.send(wid, "go", topic="go")
                    handle.result(timeout=60)
                    ms.append((time.perf_counter() - sent) * 1e3)
        finally:
            rt.shutdown()
        out[kind] = _summary(ms)
    return out


VICTIM = """
import sys
import dbos_agent as da
import dbos_agent._storage.session as session
from bench.bench_pooler import waiter
session.process_key = lambda: None  # as on another host: no pid to check
url, session_url, wid, lease = sys.argv[1], sys.argv[2] or None, sys.argv[3], float(sys.argv[4])
rt = da.launch(url, session_url=session_url, executor_id="victim", lease_seconds=lease,
               suspend_after=600, take_over=False, recover=False, run_queues=False)
da.start(waiter, workflow_id=wid)
while not da.operations.list_steps(wid):
    pass
print("ready", flush=True)
sys.stdin.read()
"""


def takeover(way: str, direct: str, bouncer: Pgbouncer, n: int, lease: float) -> dict[str, object]:
    url, session_url = _urls(way, direct, bouncer)
    peer = da.launch(
        url, session_url=session_url, executor_id="peer", take_over_every=0.5, suspend_after=600
    )
    seconds: list[float] = []
    try:
        with psycopg.connect(direct, autocommit=True) as mon:
            for i in range(n):
                wid = f"takeover-{way}-{i}"
                victim = subprocess.Popen(
                    [sys.executable, "-c", VICTIM, url, session_url or "", wid, str(lease)],
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                    cwd=ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert victim.stdout is not None
                assert victim.stdout.readline().strip() == "ready"
                time.sleep(1.0)  # a few heartbeats
                killed = time.perf_counter()
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                while True:
                    row = mon.execute(
                        "SELECT owner_key FROM dbos_agent.workflows WHERE workflow_id = %s",
                        (wid,),
                    ).fetchone()
                    if row is not None and row[0] == peer.session_key:
                        break
                    time.sleep(0.02)
                seconds.append(time.perf_counter() - killed)
                da.send(wid, "go", topic="go")
                da.retrieve(wid).result(timeout=60)
    finally:
        peer.shutdown()
    return {
        "scenario": "takeover_from_another_host",
        "way": way,
        "n": n,
        "lease_seconds": lease,
        "session_grace": 3.0,
        "take_over_every": 0.5,
        "p50_s": round(statistics.median(seconds), 2),
        "max_s": round(max(seconds), 2),
        "each_s": [round(x, 2) for x in seconds],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default="wake,takeover")
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--wake-n", type=int, default=30)
    parser.add_argument("--takeover-n", type=int, default=3)
    parser.add_argument("--lease", type=float, default=10.0)
    args = parser.parse_args()
    loadavg = Path("/proc/loadavg")
    meta = {"meta": True, "cpus": os.cpu_count()}
    if loadavg.exists():
        meta["loadavg_before"] = loadavg.read_text().split()[:3]
    print(json.dumps(meta), flush=True)
    with (
        LocalCluster.start(settings={"max_connections": "100"}) as cluster,
        Pgbouncer(cluster.url, pool_size=20) as bouncer,
    ):
        for scenario in args.scenarios.split(","):
            for way in args.ways.split(","):
                with fresh_database(cluster.url) as direct:  # a URL: pgbouncer's is made of it
                    open_system_database(direct, create=False, migrate=True, pool_size=1).close()
                    if scenario == "wake":
                        result = wake(way, direct, bouncer, args.wake_n)
                    elif scenario == "takeover":
                        result = takeover(way, direct, bouncer, args.takeover_n, args.lease)
                    else:
                        parser.error(f"unknown scenario {scenario!r}")
                    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
