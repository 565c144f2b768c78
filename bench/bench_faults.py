#!/usr/bin/env python3
"""Faults benchmark: what a Postgres restart and a killed worker cost in time.

Runs against a throwaway local cluster of its own (it restarts it), built from the same
Postgres binaries as the tests (``LocalCluster``):

  restart   one workflow of no-op steps runs in this process; the server is restarted
            ``-m immediate`` ``--restarts`` times while it runs. For each restart:
            ``ready_to_checkpoint_ms`` = from ``pg_ctl restart`` returning (the server
            accepts connections again) to the first step checkpoint committed after it,
            and ``stall_ms`` = from the last checkpoint before the restart began to that one.
  takeover  two worker processes (``dbos-agent worker``, a 30 s lease) run workflows of
            0.05 s steps; one is killed -9. ``takeover_s`` = from the kill to the first step
            the survivor starts of one of the victim's workflows. ``--mode same-host`` (the
            survivor sees the pid gone) and ``other-host`` (the victim's process key is
            cleared first, as if it ran elsewhere: the lock must stay free for the grace).

Prints one JSON line per scenario (median and max over the repeats). Also the module
the workers import (``--app bench_faults``): keep it importable without side effects.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

import dbos_agent as da

HERE = Path(__file__).resolve().parent
LOG = os.environ.get("BENCH_FAULTS_LOG", "/dev/null")
QUEUE = da.Queue("bench-faults")
STAMPS: list[float] = []


@da.step
def noop() -> None:
    pass


@da.durable_workflow
def many_steps(n: int) -> int:
    for _ in range(n):
        noop()
        STAMPS.append(time.monotonic())  # the step's checkpoint is committed by now
    return n


@da.step
def slow(i: int) -> int:
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} {da.current_workflow_id()} {i} {time.time():.6f}\n")
    time.sleep(0.05)
    return i


@da.durable_workflow
def slow_steps(n: int) -> int:
    return sum(slow(i) for i in range(n))


def _summary(name: str, values: list[float], unit: str, **extra: object) -> None:
    print(
        json.dumps(
            {
                "scenario": name,
                f"median_{unit}": round(statistics.median(values), 3),
                f"max_{unit}": round(max(values), 3),
                f"all_{unit}": [round(v, 3) for v in values],
                **extra,
            }
        ),
        flush=True,
    )


def bench_restart(cluster: object, url: str, restarts: int) -> None:
    runtime = da.launch(url, executor_id="bench-restart", workers=2)
    ready, stalls = [], []
    try:
        done = threading.Event()
        worker = threading.Thread(target=lambda: (many_steps(10**7), done.set()), daemon=True)
        worker.start()
        for _ in range(restarts):
            time.sleep(1.0)
            begun = time.monotonic()
            before = STAMPS[-1]
            cluster.restart()  # type: ignore[attr-defined]
            back = time.monotonic()
            while STAMPS[-1] <= back:
                time.sleep(0.001)
            first = next(t for t in STAMPS[-2000:] if t > back)
            ready.append((first - back) * 1000)
            stalls.append((first - before) * 1000)
            assert begun >= before
    finally:
        runtime.shutdown(grace=1)
    _summary("restart_ready_to_checkpoint", ready, "ms")
    _summary("restart_stall", stalls, "ms")


def _worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, DBOS_AGENT_DATABASE_URL=url, BENCH_FAULTS_LOG=str(log), PYTHONPATH=str(HERE)
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dbos_agent.worker",
            "--app",
            "bench_faults",
            "--quiet",
            "--lease",
            "30",
            "--poll",
            "1.0",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _lines(log: Path) -> list[tuple[int, str, float]]:
    out = []
    for line in log.read_text().splitlines():
        pid, wid, _, at = line.split()
        out.append((int(pid), wid, float(at)))
    return out


def bench_takeover(server_url: str, repeats: int, mode: str) -> None:
    from dbos_agent.testing import fresh_database

    times = []
    for r in range(repeats):
        with fresh_database(server_url) as url, tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "steps.log"
            log.touch()
            victim = _worker(url, log)
            ids = [f"victim-{r}-{i}" for i in range(4)]
            with da.Client(url) as client:
                for wid in ids:
                    client.enqueue("bench-faults", "slow_steps", 400, workflow_id=wid)
            while {w for _, w, _ in _lines(log)} < set(ids):
                time.sleep(0.05)
            survivor = _worker(url, log)
            time.sleep(2.0)  # the survivor is up and polling
            if mode == "other-host":
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("UPDATE dbos_agent.executors SET process_key = NULL")
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed = time.time()
            while not any(p == survivor.pid and w in ids for p, w, _ in _lines(log)):
                time.sleep(0.01)
            took = min(at for p, w, at in _lines(log) if p == survivor.pid and w in ids)
            times.append(took - killed)
            survivor.send_signal(signal.SIGTERM)
            survivor.wait(30)
    _summary(f"takeover_after_kill9_{mode}", times, "s", lease_s=30, grace_s=3, poll_s=1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="restart,takeover")
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from dbos_agent.postgres.throwaway import LocalCluster
    from dbos_agent.testing import fresh_database

    cluster = LocalCluster.start()
    try:
        scenarios = args.scenarios.split(",")
        if "restart" in scenarios:
            with fresh_database(cluster.url) as url:
                bench_restart(cluster, url, args.restarts)
        if "takeover" in scenarios:
            for mode in ("same-host", "other-host"):
                bench_takeover(cluster.url, args.repeats, mode)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
