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
  scale     how throughput grows with worker processes on one Postgres: for each P in
            ``--process-list`` (default 1,2,4,8) a fresh database gets N (``--scale-n``,
            default 2,000) enqueued workflows of 10 no-op steps, P worker daemons
            (``--workers`` threads each, default 8) start, and the rate is taken between
            10 % and 90 % SUCCESS (so process start-up is not counted): workflows/s,
            steps/s and the server's commits/s (``pg_stat_database.xact_commit``). Then the
            commit limit of the same server: T connections looping BEGIN; INSERT one row;
            COMMIT for ``--raw-seconds`` (T in ``--raw-threads``, default 8,32,64), from
            pgbench when ``--pgbench PATH`` is given, else from Python threads.
  pooler    a fleet through pgbouncer in transaction mode (issue 33), on a throwaway
            server of this script's own with max_connections=100 (``--pooler-max-
            connections``) and a pgbouncer of ``--pooler-pool`` (default 40) server
            connections in front of it. For each P in ``--pooler-processes`` (default
            8,50,100) and each way in ``--pooler-ways`` (default direct,pooled), N
            (``--pooler-n``, default 3,000) workflows of 10 no-op steps are enqueued on a
            fresh database, delayed; P worker daemons (``--workers`` threads,
            ``--pooler-pool-size`` connections each, default 3, take-over looks every
            ``--pooler-poll`` s, default 2, the library's default) start, directly or through
            the pooler with one URL (lease-only sessions, polled wake-ups); once all are
            registered (or the direct ones that can be: the server refuses the others),
            the workflows are made due at once, and the rate is taken between 10 % and
            90 % SUCCESS: workflows/s and steps/s, the peak of the server's connections to
            the database, the workers that failed.
            A way that does not finish within ``--pooler-timeout`` (default 300 s) is
            reported with what it finished.

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
import tempfile
import threading
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


def xact_commits(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def postmaster_pid(url: str) -> int | None:
    """The server's postmaster pid when it runs on this machine (to count its CPU)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    pidfile = Path(str(row[0]) if row else "") / "postmaster.pid"
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_ticks(pids: set[int], parent: int | None) -> tuple[int, int, int]:
    """(ticks of pids, ticks of parent's children, busy ticks of the machine): the CPU
    the workers, Postgres' backends and everything used so far (/proc, Linux only)."""
    ours = server = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        pid, ppid, ticks = int(stat.parent.name), int(fields[1]), int(fields[11]) + int(fields[12])
        if pid in pids:
            ours += ticks
        if parent is not None and (ppid == parent or pid == parent):
            server += ticks
    cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    busy = sum(cpu) - cpu[3] - cpu[4]  # all but idle and iowait
    return ours, server, busy


def scenario_scale_one(server: str, n: int, processes: int, threads: int) -> dict[str, object]:
    """One point of the curve: P worker processes drain n enqueued 10-step workflows."""
    url = fresh_db(server)
    sys.path.insert(0, str(ROOT))
    import dbos_agent as da

    with da.Client(url, pool_size=8) as client:
        for i in range(n):
            client.enqueue("bench-fleet", "fleet_job", 10, workflow_id=f"scale-{i:05d}")
    low, high = n // 10, n - n // 10
    server_pid = postmaster_pid(url)
    workers = start_workers(url, processes, "--workers", str(threads))
    pids = {w.pid for w in workers}
    try:
        marks: dict[str, tuple[float, int]] = {}
        ticks: dict[str, tuple[int, int, int]] = {}
        deadline = time.perf_counter() + 900
        while "high" not in marks:
            done = count(url, "SUCCESS")
            if "low" not in marks and done >= low:
                marks["low"] = (time.perf_counter(), done)
                commits_low = xact_commits(url)
                ticks["low"] = cpu_ticks(pids, server_pid)
            if done >= high:
                marks["high"] = (time.perf_counter(), done)
                commits_high = xact_commits(url)
                ticks["high"] = cpu_ticks(pids, server_pid)
            if time.perf_counter() > deadline:
                raise TimeoutError(f"only {done} of {n} finished")
            time.sleep(0.05)
        wait_all(url, n, 600)
    finally:
        stop_workers(workers)
    seconds = marks["high"][0] - marks["low"][0]
    finished = marks["high"][1] - marks["low"][1]
    hz = os.sysconf("SC_CLK_TCK")
    workers_cpu, server_cpu, machine_cpu = (
        (b - a) / hz / seconds for a, b in zip(ticks["low"], ticks["high"], strict=True)
    )
    return {
        "scenario": "scale",
        "processes": processes,
        "threads_per_process": threads,
        "workflows": n,
        "window_workflows": finished,
        "window_seconds": round(seconds, 3),
        "wf_per_s": round(finished / seconds, 1),
        "steps_per_s": round(10 * finished / seconds, 1),
        "commits_per_s": round((commits_high - commits_low) / seconds, 1),
        # CPU in cores (1.0 = one core busy) over the window.
        "workers_cores": round(workers_cpu, 2),
        "postgres_cores": round(server_cpu, 2) if server_pid else None,
        "machine_busy_cores": round(machine_cpu, 2),
    }


def raw_commits_python(url: str, threads: int, seconds: float) -> float:
    """T connections, each looping BEGIN; INSERT one row; COMMIT: commits/s."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial, v int)")
    counts = [0] * threads
    stop = threading.Event()

    def loop(i: int) -> None:
        with psycopg.connect(url) as conn:
            while not stop.is_set():
                conn.execute("INSERT INTO bench_raw (v) VALUES (1)")
                conn.commit()
                counts[i] += 1

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    time.sleep(seconds)  # the measuring window itself, not a synchronisation
    stop.set()
    for t in pool:
        t.join()
    return sum(counts) / seconds


def raw_commits_pgbench(url: str, pgbench: str, threads: int, seconds: float) -> float:
    """The same loop from pgbench (-c T -j 2, one INSERT per transaction): commits/s."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial, v int)")
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write("INSERT INTO bench_raw (v) VALUES (1);\n")
        script.flush()
        out = subprocess.run(
            [
                pgbench,
                "-n",
                "-f",
                script.name,
                "-c",
                str(threads),
                "-j",
                "2",
                "-T",
                str(int(seconds)),
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    for line in out.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    raise RuntimeError(f"pgbench printed no tps: {out}")


def scenario_scale(args: argparse.Namespace) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    for p in (int(x) for x in args.process_list.split(",")):
        results.append(scenario_scale_one(args.dsn, args.scale_n, p, args.workers))
    url = fresh_db(args.dsn)
    for t in (int(x) for x in args.raw_threads.split(",")):
        rate = (
            raw_commits_pgbench(url, args.pgbench, t, args.raw_seconds)
            if args.pgbench
            else raw_commits_python(url, t, args.raw_seconds)
        )
        results.append(
            {
                "scenario": "raw_commit_limit",
                "connections": t,
                "client": "pgbench" if args.pgbench else "python",
                "commits_per_s": round(rate, 1),
            }
        )
    return results


def _url_of(server: str, database: str) -> str:
    sys.path.insert(0, str(ROOT))
    from dbos_agent._storage.dsn import with_dbname

    return with_dbname(server, database)


def _backends(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
        (DB_NAME,),
    ).fetchone()
    return int(row[0]) if row else 0


def scenario_pooler_one(
    server: str, pooled_url: str | None, processes: int, args: argparse.Namespace
) -> dict[str, object]:
    """One point: P workers directly (pooled_url None) or through the pooler."""
    import dbos_agent as da
    from dbos_agent.postgres.opening import open_system_database

    direct = fresh_db(server)
    open_system_database(direct, create=False, migrate=True, pool_size=1).close()
    n, low, high = args.pooler_n, args.pooler_n // 10, args.pooler_n - args.pooler_n // 10
    with da.Client(direct, pool_size=4) as client:  # due only once every worker is up
        for i in range(n):
            client.enqueue("bench-fleet", "fleet_job", 10, workflow_id=f"pool-{i:05d}", delay=86400)
    url = pooled_url or direct
    extra = ["--workers", str(args.workers), "--pool-size", str(args.pooler_pool_size)]
    extra += ["--poll", str(args.pooler_poll)]  # take-over looks: the library's default
    workers = start_workers(url, processes, *extra)
    peak = 0
    try:
        with psycopg.connect(direct, autocommit=True) as mon:

            def sessions() -> int:
                row = mon.execute("SELECT count(*) FROM dbos_agent.executors").fetchone()
                return int(row[0]) if row else 0

            up_by = time.perf_counter() + args.pooler_timeout
            while time.perf_counter() < up_by:
                alive = sum(1 for w in workers if w.poll() is None)
                if sessions() >= alive:
                    break
                time.sleep(0.2)
            registered = sessions()
            mon.execute(
                "UPDATE dbos_agent.workflows SET wake_at = now()"
                " WHERE status = 'ENQUEUED' AND queue_name = 'bench-fleet'"
            )
            marks: dict[str, tuple[float, int]] = {}
            deadline = time.perf_counter() + args.pooler_timeout
            done = 0
            while "high" not in marks and time.perf_counter() < deadline:
                row = mon.execute(  # on this connection: the server may have no other
                    "SELECT count(*) FROM dbos_agent.workflows WHERE status = 'SUCCESS'"
                ).fetchone()
                done = int(row[0]) if row else 0
                peak = max(peak, _backends(mon))
                if "low" not in marks and done >= low:
                    marks["low"] = (time.perf_counter(), done)
                if done >= high:
                    marks["high"] = (time.perf_counter(), done)
                time.sleep(0.1)
    finally:
        stop_workers(workers)
    exited = sum(1 for w in workers if w.returncode not in (0, -signal.SIGTERM))
    result: dict[str, object] = {
        "scenario": "pooler",
        "way": "pooled (pgbouncer transaction mode, one URL)" if pooled_url else "direct",
        "processes": processes,
        "threads_per_process": args.workers,
        "pool_size_per_process": args.pooler_pool_size,
        "sessions_registered": registered,
        "workers_failed": exited,
        "workflows": n,
        "peak_server_connections": peak,
    }
    if "high" not in marks:
        result.update(finished=done, within_s=args.pooler_timeout, wf_per_s=None)
        return result
    seconds = marks["high"][0] - marks["low"][0]
    finished = marks["high"][1] - marks["low"][1]
    result.update(
        window_seconds=round(seconds, 3),
        wf_per_s=round(finished / seconds, 1),
        steps_per_s=round(10 * finished / seconds, 1),
    )
    return result


def scenario_pooler(args: argparse.Namespace) -> list[dict[str, object]]:
    """The ``pooler`` scenario, on a server and a pgbouncer of its own."""
    sys.path.insert(0, str(ROOT))
    from dbos_agent.postgres.pgbouncer import Pgbouncer
    from dbos_agent.postgres.throwaway import LocalCluster

    settings = {"max_connections": str(args.pooler_max_connections)}
    results: list[dict[str, object]] = []
    with (
        LocalCluster.start(settings=settings) as cluster,
        Pgbouncer(cluster.url, pool_size=args.pooler_pool, max_client_conn=20000) as bouncer,
    ):
        pooled = bouncer.pooled_url(_url_of(cluster.url, DB_NAME))
        for p in (int(x) for x in args.pooler_processes.split(",")):
            for way in args.pooler_ways.split(","):
                result = scenario_pooler_one(
                    cluster.url, pooled if way == "pooled" else None, p, args
                )
                result["max_connections"] = args.pooler_max_connections
                result["pgbouncer_pool"] = args.pooler_pool
                print(json.dumps(result), flush=True)
                results.append(result)
    return []  # printed as they came


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dsn", default=None, help="a Postgres server URL (all but the pooler scenario)"
    )
    parser.add_argument("--scenarios", default="orphans,queue")
    parser.add_argument("--orphans", type=int, default=10_000)
    parser.add_argument("--queued", type=int, default=5_000)
    parser.add_argument("--scale-n", type=int, default=2_000)
    parser.add_argument("--process-list", default="1,2,4,8")
    parser.add_argument("--workers", type=int, default=8, help="threads per worker process")
    parser.add_argument("--raw-threads", default="8,32,64")
    parser.add_argument("--raw-seconds", type=float, default=5.0)
    parser.add_argument("--pgbench", default=None, help="pgbench binary for the raw limit")
    parser.add_argument("--pooler-processes", default="8,50,100")
    parser.add_argument("--pooler-ways", default="direct,pooled")
    parser.add_argument("--pooler-n", type=int, default=3000)  # due at once, workers all up
    parser.add_argument("--pooler-pool", type=int, default=40, help="pgbouncer's server pool")
    parser.add_argument("--pooler-pool-size", type=int, default=3, help="per worker process")
    parser.add_argument("--pooler-max-connections", type=int, default=100)
    parser.add_argument("--pooler-timeout", type=float, default=300.0)
    parser.add_argument("--pooler-poll", type=float, default=2.0, help="workers' --poll")
    args = parser.parse_args()
    loadavg = Path("/proc/loadavg")
    print(
        json.dumps(
            {
                "meta": True,
                "cpus": os.cpu_count(),
                "loadavg_before": loadavg.read_text().split()[:3] if loadavg.exists() else None,
            }
        ),
        flush=True,
    )
    for name in args.scenarios.split(","):
        if name != "pooler" and not args.dsn:
            parser.error(f"--dsn is needed for the {name} scenario")
        if name == "orphans":
            results = [scenario_orphans(args.dsn, args.orphans)]
        elif name == "queue":
            results = [scenario_queue(args.dsn, args.queued)]
        elif name == "scale":
            results = scenario_scale(args)
        elif name == "pooler":
            results = scenario_pooler(args)
        else:
            parser.error(f"unknown scenario {name!r}")
        for result in results:
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
