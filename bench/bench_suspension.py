#!/usr/bin/env python3
"""Waiting costs nothing: park N workflows in recv on one worker, restart it, wake them.

    python bench/bench_suspension.py --dsn postgresql://postgres@127.0.0.1:55432/postgres \
        --n 100000 --steady-n 10000 --rate 1000

Phases, each measured from outside the worker process (its RSS and threads are read
from /proc, the workflows' states from the database):

1. park: a worker child (``launch(workers=W)``, ``--workers``, default 16) starts N
   workflows that each wait in ``da.recv("go", timeout=None)``; time until all N are
   SUSPENDED, the worker's peak RSS and thread count, and rows and bytes per suspended
   workflow (tables and indexes of the dbos_agent schema, before and after).
2. restart: the worker is killed -9 while all N are suspended; a fresh worker is
   timed from start to ``launch()`` returning, its RSS read 5 s later, and the number
   of workflows it replayed meanwhile counted (none may run before its message).
3. wake at full speed: 4 sender threads send one message to each of the N workflows
   through ``da.Client`` (a process that has only the URL); every workflow records,
   in its next step, the time from its send to that step. Resumptions/s and the
   p50/p99 of send -> resumed step.
4. wake at a steady rate: the worker of phase 2 is killed and one new worker parks
   ``--steady-n`` more (one worker, as in phase 3), then messages are sent at
   ``--rate`` per second, from Python threads or, with ``--pgbench``, from pgbench
   (Poisson arrivals at that mean rate, a C client that leaves the two cores to the
   worker and Postgres); the same latency figures.

Before each wake phase the schema's tables are vacuumed and analyzed and a CHECKPOINT
taken (as pgbench does before its runs), so that autovacuum or a checkpoint started by
the parking does not land inside the timed phase by chance.

It uses the database ``dbos_agent_bench_susp`` on the DSN's server, dropped and
created at start. One JSON line per phase, then a markdown table.
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
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import dbos_agent as da
from dbos_agent._storage.sql_files import query

DB_NAME = "dbos_agent_bench_susp"
#: The worker's ``workers`` (threads for running sync workflows); --workers sets it.
WORKERS = int(os.environ.get("DBOS_AGENT_BENCH_WORKERS", "16"))
ROOT = Path(__file__).resolve().parents[1]


@da.step
def resumed(sent_at: float) -> float:
    """Seconds from the send to this step: the wake-up latency."""
    return time.time() - sent_at


@da.durable_workflow(name="bench_parked")
def parked(i: int) -> float:
    message = da.recv("go", timeout=None)
    return resumed(float(message["sent"]))


# -- children ------------------------------------------------------------------------------


def child_park(url: str, prefix: str, n: int) -> None:
    """Launch a worker, start ``n`` waiting workflows, then serve (wake) until killed."""
    rt = da.launch(url, executor_id=f"bench-{os.getpid()}", workers=WORKERS)
    for i in range(n):
        while len(rt.running()) > 2000:  # keep the backlog of starts bounded
            time.sleep(0.01)
        da.start(parked, i, workflow_id=f"{prefix}-{i}")
    print("started", flush=True)
    threading.Event().wait()


def child_serve(url: str) -> None:
    """Launch a worker (timing launch()), then serve until killed."""
    started = time.perf_counter()
    da.launch(url, executor_id=f"bench-{os.getpid()}", workers=WORKERS)
    print(json.dumps({"launch_s": time.perf_counter() - started}), flush=True)
    threading.Event().wait()


# -- measuring -----------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM in MiB and Threads of a live process."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
        elif key == "Threads":
            out[key] = int(value)
    return out


class Sampler:
    """Peak RSS and threads of a child, sampled every 0.2 s in the background."""

    def __init__(self, pid: int) -> None:
        self.pid, self.rss, self.threads = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                status = proc_status(self.pid)
            except (FileNotFoundError, ProcessLookupError):
                return
            self.rss = max(self.rss, status.get("VmHWM", 0))
            self.threads = max(self.threads, status.get("Threads", 0))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def count(url: str, status: str, prefix: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dbos_agent.workflows WHERE status = %s AND workflow_id LIKE %s",
            (status, prefix + "-%"),
        ).fetchone()
    return int(row[0]) if row else 0


def footprint(url: str) -> tuple[int, int]:
    """(rows, bytes) of the dbos_agent schema's workflows and steps, with indexes."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM dbos_agent.workflows)"
            " + (SELECT count(*) FROM dbos_agent.steps),"
            " pg_total_relation_size('dbos_agent.workflows')"
            " + pg_total_relation_size('dbos_agent.steps')"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.1)


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def latencies(url: str, prefix: str) -> list[float]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT output::text FROM dbos_agent.workflows"
            " WHERE status = 'SUCCESS' AND workflow_id LIKE %s",
            (prefix + "-%",),
        ).fetchall()
    return [float(r[0]) for r in rows]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def send_all(url: str, prefix: str, n: int, rate: float | None, threads: int = 4) -> float:
    """Send one message to each workflow (at ``rate``/s, else as fast as ``threads`` go);
    returns when the last send returned."""
    started = time.monotonic()

    def sender(part: int) -> None:
        with da.Client(url, pool_size=1) as client:
            for i in range(part, n, threads):
                if rate is not None:
                    due = started + i / rate
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                client.send(f"{prefix}-{i}", {"sent": time.time()}, topic="go")

    workers = [threading.Thread(target=sender, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.monotonic() - started


def pgbench_send_all(url: str, prefix: str, n: int, rate: float, pgbench: str) -> float:
    """The steady sends from a C client: ``pgbench -R rate`` (Poisson arrivals at that
    mean rate) runs the very statement ``Client.send`` runs (``insert_message``), one
    message to each of the ``n`` workflows, its send time taken on the database clock
    (the same machine's clock as the workers'). Python sender threads share the two
    cores with the workers and Postgres and cannot hold 1,000/s here; pgbench can."""
    clients = 4
    values = {
        # a scalar subquery runs once per statement (an expression would run per row)
        "destination_id": f"(SELECT '{prefix}-' || (nextval('bench_send_seq') - 1))",
        "topic": "'go'",
        "message": "json_build_object('sent', extract(epoch FROM clock_timestamp()))::text",
        "idempotency_key": "NULL",
    }
    text = query("insert_message")
    for name, value in values.items():
        text = text.replace(f"%({name})s", value)
    script = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SEQUENCE IF EXISTS bench_send_seq")
        conn.execute("CREATE SEQUENCE bench_send_seq")
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(script.rstrip().rstrip(";") + ";\n")
        f.flush()
        per_client = -(-n // clients)  # extra sends go to ids that do not exist: no-ops
        started = time.monotonic()
        subprocess.run(
            [
                pgbench,
                "-n",
                "-M",
                "prepared",
                "-f",
                f.name,
                "-c",
                str(clients),
                "-j",
                "2",
                "-R",
                str(rate),
                "-t",
                str(per_client),
                url,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return time.monotonic() - started


def park(url: str, prefix: str, n: int) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    rows0, bytes0 = footprint(url)
    started = time.monotonic()
    worker = spawn("park", url, prefix, str(n))
    sampler = Sampler(worker.pid)
    wait_for(lambda: count(url, "SUSPENDED", prefix) >= n, 3600, f"{n} suspended")
    park_s = time.monotonic() - started
    sampler.stop()
    rows1, bytes1 = footprint(url)
    return worker, {
        "n": n,
        "park_s": round(park_s, 2),
        "parked_per_s": round(n / park_s),
        "worker_peak_rss_mb": sampler.rss,
        "worker_peak_threads": sampler.threads,
        "rows_per_waiter": round((rows1 - rows0) / n, 2),
        "bytes_per_waiter": round((bytes1 - bytes0) / n),
    }


def settle(url: str) -> None:
    """Vacuum and analyze the schema's tables and take a checkpoint before a timed phase."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("workflows", "steps", "messages"):
            conn.execute(f"VACUUM (ANALYZE) dbos_agent.{table}")
        conn.execute("CHECKPOINT")


def wake(
    url: str,
    prefix: str,
    n: int,
    rate: float | None,
    threads: int = 4,
    pgbench: str | None = None,
) -> dict[str, Any]:
    settle(url)
    started = time.monotonic()
    if pgbench is not None and rate is not None:
        send_s = pgbench_send_all(url, prefix, n, rate, pgbench)
    else:
        send_s = send_all(url, prefix, n, rate, threads)
    wait_for(lambda: count(url, "SUCCESS", prefix) >= n, 3600, f"{n} woken")
    total_s = time.monotonic() - started
    lat = latencies(url, prefix)
    return {
        "n": n,
        "rate": rate or "full",
        "sender": "pgbench" if pgbench is not None and rate is not None else "client",
        "send_threads": threads,
        "sends_per_s": round(n / send_s),
        "send_s": round(send_s, 2),
        "all_resumed_s": round(total_s, 2),
        "resumptions_per_s": round(n / total_s),
        "p50_ms": round(statistics.median(lat) * 1e3, 1),
        "p99_ms": round(pct(lat, 99) * 1e3, 1),
    }


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:55432/postgres")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--steady-n", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--send-threads", type=int, default=4, help="sender threads")
    parser.add_argument(
        "--pgbench",
        help="path to pgbench: the steady sends come from it (-R rate) instead of Python threads",
    )
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help="the worker's launch(workers=...)"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["DBOS_AGENT_BENCH_WORKERS"] = str(args.workers)  # for the children
    if args.child:
        mode, url, *rest = args.child
        if mode == "park":
            child_park(url, rest[0], int(rest[1]))
        else:
            child_serve(url)
        return 0

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB_NAME}")
    parts = conninfo_to_dict(make_conninfo(args.dsn, dbname=DB_NAME))
    url = (
        f"postgresql://{parts.get('user', 'postgres')}@{parts.get('host', '127.0.0.1')}:"
        f"{parts.get('port', 5432)}/{DB_NAME}"
    )
    da.Client(url).close()  # apply the schema before the clock starts
    results: list[dict[str, Any]] = []

    worker, parked_stats = park(url, "park", args.n)
    results.append({"phase": "park", **parked_stats})
    print(json.dumps(results[-1]), flush=True)

    kill(worker)  # all N are suspended: nothing of theirs is in memory anywhere
    serving = spawn("serve", url)
    assert serving.stdout is not None
    launched = json.loads(serving.stdout.readline())
    time.sleep(5.0)
    status = proc_status(serving.pid)
    replayed = count(url, "PENDING", "park") + count(url, "SUCCESS", "park")
    results.append(
        {
            "phase": "restart",
            "n_suspended": args.n,
            "launch_s": round(launched["launch_s"], 3),
            "rss_mb_after_5s": status["VmRSS"],
            "threads_after_5s": status["Threads"],
            "replayed_before_any_send": replayed,
        }
    )
    print(json.dumps(results[-1]), flush=True)

    results.append(
        {"phase": "wake_full_speed", **wake(url, "park", args.n, None, args.send_threads)}
    )
    print(json.dumps(results[-1]), flush=True)

    kill(serving)  # the steady phase has one worker: the one that parks its waiters
    steady, steady_stats = park(url, "steady", args.steady_n)
    results.append({"phase": "park_steady", **steady_stats})
    print(json.dumps(results[-1]), flush=True)
    results.append(
        {
            "phase": "wake_steady",
            **wake(url, "steady", args.steady_n, args.rate, args.send_threads, args.pgbench),
        }
    )
    print(json.dumps(results[-1]), flush=True)
    kill(steady)

    print("\n| phase | figures |\n|---|---|")
    for r in results:
        figures = ", ".join(f"{k} {v}" for k, v in r.items() if k != "phase")
        print(f"| {r['phase']} | {figures} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
