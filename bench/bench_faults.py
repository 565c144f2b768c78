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
  busy      three plain application processes (``da.launch()``, 16 workers each, the
            default 2 s take-over period), as in issue 28: the victim holds ``--victims``
            (152) workflows of 5 steps of 0.02 s (16 in a first step that does not end
            there, the rest queued in its pool); the survivors are full (16 workflows each
            of 0.05 s steps), one for ``--busy-a`` (10) more seconds, the other for
            ``--busy-b`` (2). The victim is killed -9. ``first_step_s`` = from the kill to
            the first step a survivor runs of each victim workflow; reported: the last of
            them, the median of their medians, how many each survivor took, when each
            survivor's own work ended (``own_work_ended_s``: from then on it has room) and
            from the first of those to the last first step (``after_first_room_s``).

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
from typing import Any

import psycopg

import dbos_agent as da

HERE = Path(__file__).resolve().parent
#: The children import this file (as ``bench_faults``) and this checkout's dbos_agent.
CHILD_PATH = os.pathsep.join([str(HERE), str(HERE.parent)])
LOG = os.environ.get("BENCH_FAULTS_LOG", "/dev/null")
#: The victim of ``busy``: its steps never end (its workflows wait for the survivors).
HOLD = os.environ.get("BENCH_FAULTS_HOLD") == "1"
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
def slow(i: int, seconds: float = 0.05) -> int:
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} {da.current_workflow_id()} {i} {time.time():.6f}\n")
    time.sleep(3600 if HOLD else seconds)
    return i


@da.durable_workflow
def slow_steps(n: int, seconds: float = 0.05) -> int:
    return sum(slow(i, seconds) for i in range(n))


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
        os.environ, DBOS_AGENT_DATABASE_URL=url, BENCH_FAULTS_LOG=str(log), PYTHONPATH=CHILD_PATH
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


def _app_process(
    url: str, log: Path, prefix: str, count: int, steps: int, seconds: float, hold: bool = False
) -> subprocess.Popen[str]:
    """A plain application process (this file, ``--app-process``): it launches with the
    defaults, starts ``count`` workflows of ``steps`` steps of ``seconds`` (``hold``: its
    steps never end) under ids ``PREFIX-i``, prints "started" and stays up until SIGTERM."""
    env = dict(
        os.environ,
        DBOS_AGENT_DATABASE_URL=url,
        BENCH_FAULTS_LOG=str(log),
        BENCH_FAULTS_HOLD="1" if hold else "0",
        PYTHONPATH=CHILD_PATH,
    )
    args = ["--app-process", prefix, str(count), str(steps), str(seconds)]
    return subprocess.Popen(
        [sys.executable, "-m", "bench_faults", *args],
        env=env,
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def app_process(prefix: str, count: int, steps: int, seconds: float) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with da.launch(executor_id=f"bench-{prefix}"):
        for i in range(count):
            da.start(slow_steps, steps, seconds, workflow_id=f"{prefix}-{i}")
        print("started", flush=True)
        stop.wait()
    return 0


def _busy_once(
    url: str, log: Path, r: int, victims: int, busy: tuple[float, float]
) -> dict[str, Any]:
    """One round of ``busy``: the first step of each victim workflow in a survivor, and
    when each survivor's own work ended, in seconds from the kill."""
    step_s, rounds = 0.05, [int((b + 1.0) / 0.05) for b in busy]
    victim = _app_process(url, log, f"victim-{r}", victims, 5, 0.02, hold=True)
    ids = {f"victim-{r}-{i}" for i in range(victims)}
    assert victim.stdout is not None and victim.stdout.readline().strip() == "started"
    while len({w for p, w, _ in _lines(log) if p == victim.pid}) < 16:
        time.sleep(0.01)
    owns = [f"own-{name}-{r}-" for name in "ab"]
    survivors = [
        _app_process(url, log, own.rstrip("-"), 16, n, step_s)
        for own, n in zip(owns, rounds, strict=True)
    ]
    for proc in survivors:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    while len({w for _, w, _ in _lines(log) if w.startswith(tuple(owns))}) < 32:
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed = time.time()
    pids = [proc.pid for proc in survivors]
    first: dict[str, tuple[float, int]] = {}
    own_ended: list[float] = []
    deadline = time.monotonic() + 120
    while (len(first) < victims or len(own_ended) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
        rows = _lines(log)
        for p, w, at in rows:
            if p in pids and w in ids and w not in first:
                first[w] = (at, p)
        ends = [[at for _, w, at in rows if w.startswith(own)] for own in owns]
        if all(len(e) == 16 * n for e, n in zip(ends, rounds, strict=True)):
            own_ended = [max(e) + step_s - killed for e in ends]
    for proc in survivors:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    delays = [at - killed for at, _ in first.values()]
    last = max(delays) if len(first) == victims else float("inf")
    return {
        "last": last,
        "median": statistics.median(delays),
        "taken": [sum(p == pid for _, p in first.values()) for pid in pids],
        "own_ended": [round(e, 2) for e in own_ended],
        "after_room": last - min(own_ended, default=float("nan")),
    }


def bench_busy(server_url: str, repeats: int, victims: int, busy: tuple[float, float]) -> None:
    from dbos_agent.testing import fresh_database

    runs = []
    for r in range(repeats):
        with fresh_database(server_url) as url, tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "steps.log"
            log.touch()
            runs.append(_busy_once(url, log, r, victims, busy))
    _summary(
        "busy_takeover_first_step",
        [run["last"] for run in runs],
        "s",
        median_of_medians_s=round(statistics.median(run["median"] for run in runs), 3),
        after_first_room_s=[round(run["after_room"], 3) for run in runs],
        taken_by_survivor=[run["taken"] for run in runs],
        own_work_ended_s=[run["own_ended"] for run in runs],
        victims=victims,
        workers=16,
        poll_s=2.0,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="restart,takeover,busy")
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--victims", type=int, default=152)
    parser.add_argument("--busy-a", type=float, default=10.0)
    parser.add_argument("--busy-b", type=float, default=2.0)
    parser.add_argument("--app-process", nargs=4, metavar=("PREFIX", "N", "STEPS", "SECONDS"))
    args = parser.parse_args()
    if args.app_process:
        prefix, count, steps, seconds = args.app_process
        return app_process(prefix, int(count), int(steps), float(seconds))
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
        if "busy" in scenarios:
            bench_busy(cluster.url, args.repeats, args.victims, (args.busy_a, args.busy_b))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
