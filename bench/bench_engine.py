#!/usr/bin/env python3
"""Engine benchmark: dbos_agent on a given Postgres, side by side with the DBOS Transact peer.

It mirrors the scenarios, workflow shapes, counts and footprint method of the
shared peer benchmark (``../shared/bench/peer_dbos.py``) and the physical
limit of ``../shared/bench/pg_limit.py`` (``seq_insert_txn``), so that the
figures of the three scripts, run against one server in one sitting, compare.

Run (see bench/README.md for the scratch cluster and the peer)::

    python bench/bench_engine.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python bench/bench_engine.py --dsn ... --repeat 1 --scenarios latency,footprint
    python bench/bench_engine.py --dsn ... --no-fresh --scenarios throughput_threads \\
        --thread-list 1,2,4,8,16,64
    # side-by-side table from saved outputs (no run):
    python bench/bench_engine.py --report ours.jsonl --peer peer.jsonl --pg-limit limit.jsonl
    # the library through pgbouncer in transaction mode (started here, in front of --dsn;
    # the schema is migrated directly first), one pooled URL:
    python bench/bench_engine.py --dsn ... --pgbouncer --scenarios raw,latency

Scenarios (``--scenarios``, comma-separated; default: all, in this order):

  raw                 (a) one psycopg connection, 3000 x BEGIN/INSERT/COMMIT of one row
                      (= pg_limit's seq_insert_txn): p50/p99 ms and rate/s.
  latency             (b)+(c) sequential workflows of 0, 1 and 100 no-op steps (300, 300
                      and 30 calls after 10 warm-ups each): p50/p99 ms;
                      per_step_ms = (p50(wf100) - p50(wf1)) / 99, and its ratio to (a).
  throughput_threads  (d) 1000 workflows x 10 no-op steps, called directly (``wf(10)``)
                      from a T-thread pool (T from ``--thread-list``, default 8,64), with
                      pool_size = max(8, T) connections: wf/s and steps/s. Each run is
                      paired with a raw run of T threads (pg_limit's concurrent
                      INSERT+COMMIT for --raw-seconds, in its own child just before), and
                      the ratio is taken pair by pair: durable writes/s (10 steps, the
                      start and the outcome per workflow) and steps/s over raw commits/s.
  replay              (e) a child runs a workflow of 1000 no-op steps that blocks in step
                      1001; once 1000 step rows exist it is kill -9'd. A fresh child then
                      (mode "call") re-calls it under the same id with launch(recover=False)
                      and times call start -> live step entered (= replay of 1000 recorded
                      steps, log load included), and (mode "recover") a second crashed run
                      is timed from launch() -> live step entered via recovery at launch.
  recovery            (f) exactly as the peer's: a child da.start()s 1000 workflows that
                      block after step 1 (10 steps each); once all have checkpointed step 1
                      it is kill -9'd; a fresh process is timed from da.launch() until all
                      1000 are SUCCESS (9 remaining steps each).
  footprint           (g) deltas of pg_stat_user_tables (schema dbos_agent), WAL LSN, xids
                      handed out (write txns) and xact_commit over 50 workflows of 1 step and
                      50 of 101 steps, minus an idle window; per step = (d101 - d1) / 5000.
                      Sleeps --stats-sleep (11 s) before each snapshot for the stats flush.

Every scenario runs in a fresh child process (this file with ``--role``), once per
``--repeat`` (default 3); one JSON line is printed per scenario with the median over
repeats of each figure plus ``<figure>_range: [min, max]``; a readable table follows.
Each child uses its own executor_id, so recovery only ever sees that run's workflows.

The benchmark uses its own database ``dbos_agent_bench`` on the DSN's server, dropped
and recreated at start unless ``--no-fresh``. Needs dbos_agent (and psycopg 3).
``--profile DIR`` writes a cProfile dump per child into DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg.conninfo import make_conninfo

import dbos_agent as da
from dbos_agent._engine.runtime.current import current_engine

BENCH_DB = "dbos_agent_bench"
PAYLOAD = json.dumps({"output": "x" * 64, "n": 1})  # same row as pg_limit.py
INSERT = "INSERT INTO bench_ins (k, v) VALUES (%s, %s)"
ROLE = "parent"

BLOCKED = [0]
BLOCKED_LOCK = threading.Lock()
LIVE_STEP_AT: list[float] = [0.0]
LIVE_STEP = threading.Event()


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def bench_dsn(dsn):
    return make_conninfo(dsn, dbname=BENCH_DB)


def machine_busy():
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + vals[4]  # idle + iowait
    return sum(vals) - idle, sum(vals)


def server_cpu(conn):
    """{pid: CPU seconds} of the server's processes, if they run on this machine."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity").fetchall():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return out


def cpu_window(fn, dsn):
    """Run fn(); return (result, wall s, CPU % of this process, of the Postgres processes
    (-1 if the server is not on this machine) and of the whole machine; 100 = one core)."""
    with psycopg.connect(bench_dsn(dsn), autocommit=True) as mon:
        s0, p0, m0, t0 = server_cpu(mon), os.times(), machine_busy(), time.perf_counter()
        out = fn()
        wall = time.perf_counter() - t0
        p1, m1, s1 = os.times(), machine_busy(), server_cpu(mon)
    proc = (p1.user + p1.system - p0.user - p0.system) / wall * 100
    machine = (m1[0] - m0[0]) / max(1, m1[1] - m0[1]) * 100 * (os.cpu_count() or 1)
    server = (sum(v - s0.get(pid, 0.0) for pid, v in s1.items()) / wall * 100) if s1 else -1
    return out, wall, proc, server, machine


# --------------------------------------------------------------------------
# Workflows (defined in every process: names are the functions' qualnames).


@da.step
def noop() -> None:
    return None


@da.durable_workflow
def wf_steps(n: int) -> int:
    for _ in range(n):
        noop()
    return n


@da.durable_workflow
def wf_recover(i: int) -> int:
    noop()
    if ROLE == "recovery_crash":  # block forever after step 1; the parent kill -9s us
        with BLOCKED_LOCK:
            BLOCKED[0] += 1
        threading.Event().wait()
    for _ in range(9):
        noop()
    return i


@da.step
def live_gate() -> None:
    """Step n+1 of wf_replay: blocks forever in the crashing child, returns at once after."""
    if ROLE == "replay_crash":
        threading.Event().wait()
    LIVE_STEP_AT[0] = time.perf_counter()
    LIVE_STEP.set()


@da.durable_workflow
def wf_replay(n: int) -> int:
    for _ in range(n):
        noop()
    live_gate()
    return n


def launch(a, **kw):
    kw.setdefault("executor_id", a.executor_id or f"{ROLE}-{uuid.uuid4().hex[:10]}")
    return da.launch(a.app_dsn or bench_dsn(a.dsn), **kw)


def count_success(conn, prefix):
    return conn.execute(
        "SELECT count(*) FROM dbos_agent.workflows WHERE workflow_id LIKE %s "
        "AND status = 'SUCCESS'",
        (prefix + "-%",),
    ).fetchone()[0]


def wait_all(dsn, prefix, n, timeout=600):
    with psycopg.connect(bench_dsn(dsn), autocommit=True) as c:
        end = time.time() + timeout
        while count_success(c, prefix) < n:
            if time.time() > end:
                raise TimeoutError(prefix)
            time.sleep(0.02)


# --------------------------------------------------------------------------
# Child roles: each prints exactly one JSON dict on its last stdout line.


def role_raw(a):
    """pg_limit.sequential(INSERT, autocommit=False): BEGIN/INSERT/COMMIT per row."""
    lat = []
    with psycopg.connect(bench_dsn(a.dsn), autocommit=False, prepare_threshold=0) as c:
        t_all = time.perf_counter()
        for _ in range(a.raw_n):
            t = time.perf_counter()
            c.execute(INSERT, (uuid.uuid4().hex, PAYLOAD))
            c.commit()
            lat.append(time.perf_counter() - t)
        wall = time.perf_counter() - t_all
    return {
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "per_s": a.raw_n / wall,
    }


def role_raw_threads(a):
    """pg_limit.concurrent: T connections, each looping BEGIN/INSERT/COMMIT for
    --raw-seconds; the raw commit limit that throughput_threads is compared with."""
    conns = [psycopg.connect(bench_dsn(a.dsn), prepare_threshold=0) for _ in range(a.threads)]
    counts = [0] * a.threads
    start = threading.Event()
    stop = [0.0]

    def worker(i):
        c, prefix, j = conns[i], uuid.uuid4().hex[:8], 0
        start.wait()
        while time.perf_counter() < stop[0]:
            c.execute(INSERT, (f"{prefix}-{j}", PAYLOAD))
            c.commit()
            j += 1
        counts[i] = j

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(a.threads)]
    for t in ts:
        t.start()
    stop[0] = time.perf_counter() + a.raw_seconds
    start.set()
    for t in ts:
        t.join()
    for c in conns:
        c.close()
    return {"commits_per_s": sum(counts) / a.raw_seconds}


def role_latency(a):
    rt = launch(a)
    rt.wait_for_recovery(30)
    out = {}
    for n in (0, 1, 100):
        count = a.latency_n if n < 100 else a.steps100_n
        for _ in range(10):
            wf_steps(n)  # warm-up
        lat = []
        for _ in range(count):
            t = time.perf_counter()
            wf_steps(n)
            lat.append(time.perf_counter() - t)
        out[f"wf{n}_p50_ms"] = statistics.median(lat) * 1e3
        out[f"wf{n}_p99_ms"] = pct(lat, 99) * 1e3
    out["per_step_ms"] = (out["wf100_p50_ms"] - out["wf1_p50_ms"]) / 99
    out["wf1_per_s_sequential"] = 1e3 / out["wf1_p50_ms"]
    out["rss_peak_mb"] = rss_mb()
    return out


def role_throughput_threads(a):
    rt = launch(a, pool_size=max(8, a.threads))
    rt.wait_for_recovery(30)
    with ThreadPoolExecutor(a.threads) as ex:
        list(ex.map(wf_steps, [10] * 50))  # warm-up
        _, wall, proc, server, machine = cpu_window(
            lambda: list(ex.map(wf_steps, [10] * a.workflows)), a.dsn
        )
    return {
        "workflows_per_s": a.workflows / wall,
        "steps_per_s": 10 * a.workflows / wall,
        "client_cpu_pct": proc,
        "server_cpu_pct": server,
        "machine_cpu_pct": machine,
        "rss_peak_mb": rss_mb(),
    }


def role_replay_crash(a):
    launch(a)
    with da.workflow_id(a.wid):
        wf_replay(a.replay_n)  # blocks forever in live_gate(); the parent kill -9s us


def role_replay_resume(a):
    if a.mode == "call":  # re-call under the same id: resumes from the log, here
        launch(a, recover=False)
        t0 = time.perf_counter()
        with da.workflow_id(a.wid):
            wf_replay(a.replay_n)
        t_end = time.perf_counter()
        out = {"replay_ms": (LIVE_STEP_AT[0] - t0) * 1e3, "call_total_ms": (t_end - t0) * 1e3}
    else:  # recovery at launch finds it and resumes it on a worker
        t0 = time.perf_counter()
        launch(a)
        t_launch = time.perf_counter()
        if not LIVE_STEP.wait(120):
            raise TimeoutError("recovery never reached the live step")
        da.retrieve(a.wid).result(120)
        out = {
            "launch_ms": (t_launch - t0) * 1e3,
            "launch_to_live_step_ms": (LIVE_STEP_AT[0] - t0) * 1e3,
        }
    steps = da.operations.list_steps(a.wid)
    assert len(steps) == a.replay_n + 1, len(steps)
    assert da.retrieve(a.wid).status() == da.WorkflowStatus.SUCCESS
    load = current_engine().db.steps.load  # internal: the read that replay starts with
    t = time.perf_counter()
    load(a.wid)
    out["load_log_ms"] = (time.perf_counter() - t) * 1e3  # warm, n+1 rows
    out["rss_peak_mb"] = rss_mb()
    return out


def role_recovery_crash(a):
    # Every blocked workflow holds a worker thread (not a connection): make room for all.
    launch(a, workers=a.recover_n + 16, pool_size=20)
    for i in range(a.recover_n):
        da.start(wf_recover, i, workflow_id=f"{a.prefix}-{i}")
    while BLOCKED[0] < a.recover_n:
        time.sleep(0.01)
    print(json.dumps({"ready": True, "rss_peak_mb": rss_mb()}), flush=True)
    threading.Event().wait()  # parent kills us with SIGKILL


def role_recovery_resume(a):
    kw = {"workers": a.recover_workers} if a.recover_workers else {}
    t = time.perf_counter()
    rt = launch(a, **kw)
    t_launch = time.perf_counter() - t
    wait_all(a.dsn, a.prefix, a.recover_n)
    out = {"launch_s": t_launch, "recover_all_s": time.perf_counter() - t}
    rt.wait_for_recovery(10)
    out["recovered"] = rt.last_recovery.recovered if rt.last_recovery else -1
    out["rss_peak_mb"] = rss_mb()
    return out


def snapshot(a):
    """Counters of the bench DB; pg_stat counters lag up to ~10 s, so sleep first."""
    time.sleep(a.stats_sleep)
    with psycopg.connect(bench_dsn(a.dsn), autocommit=True) as c:
        q = lambda sql: c.execute(sql).fetchone()[0]  # noqa: E731
        s = {
            "wal_bytes": float(q("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")),
            # xids handed out = write transactions (server-wide; nothing else runs)
            "write_txns": int(q("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")),
            # all committed transactions in the bench DB, read-only ones included
            "all_txns": q(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ),
        }
        rows = c.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, "
            "pg_total_relation_size(relid) FROM pg_stat_user_tables "
            "WHERE schemaname = 'dbos_agent'"
        ).fetchall()
        for rel, ins, upd, dele, _ in rows:
            s[f"{rel}.ins"], s[f"{rel}.upd"], s[f"{rel}.del"] = ins, upd, dele
        s["rows_ins"] = sum(r[1] for r in rows)
        s["rows_upd"] = sum(r[2] for r in rows)
        s["table_bytes"] = sum(r[4] for r in rows)  # heap + indexes + toast
        return s


def role_footprint(a):
    """Deltas over k workflows of 1 step and k of 101 steps, minus an idle window.
    per_step = (d101 - d1) / (100 k); per_wf1 = (d1 - idle) / k."""
    rt = launch(a)
    rt.wait_for_recovery(30)
    k = a.footprint_n
    s0 = snapshot(a)
    s1 = snapshot(a)  # idle window: background activity only
    for _ in range(k):
        wf_steps(1)
    s2 = snapshot(a)
    for _ in range(k):
        wf_steps(101)
    s3 = snapshot(a)
    out = {}
    for key in s0:
        idle, d1, d101 = s1[key] - s0[key], s2[key] - s1[key], s3[key] - s2[key]
        per_step, per_wf = (d101 - d1) / (k * 100), (d1 - idle) / k
        if "." not in key or abs(per_step) >= 0.01 or abs(per_wf) >= 0.01:
            out[f"{key}_per_step"] = per_step
            out[f"{key}_per_wf1"] = per_wf
        if "." not in key:
            out[f"{key}_idle"] = idle
    out["rss_peak_mb"] = rss_mb()
    return out


# --------------------------------------------------------------------------
# Parent: run children, aggregate.

CHILD_OPTS = (
    "workflows",
    "threads",
    "latency_n",
    "steps100_n",
    "footprint_n",
    "recover_n",
    "recover_workers",
    "replay_n",
    "raw_n",
    "raw_seconds",
    "stats_sleep",
)


def child_cmd(a, role, extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--dsn", a.dsn, "--role", role, *extra]
    if a.app_dsn:
        cmd += ["--app-dsn", a.app_dsn]
    for k in CHILD_OPTS:
        cmd += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    if a.profile:
        cmd += ["--profile", a.profile]
    return cmd


def child(a, role, *extra):
    out = subprocess.run(
        child_cmd(a, role, extra),
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=a.child_timeout,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def spawn(a, role, *extra):
    return subprocess.Popen(child_cmd(a, role, extra), stdout=subprocess.PIPE, text=True)


def kill9(p):
    os.kill(p.pid, signal.SIGKILL)  # the crash
    p.wait()


def read_line(p, timeout):
    """The child's first stdout line, or TimeoutError (the child is killed)."""
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready:
        kill9(p)
        raise TimeoutError("the crashing child never reported ready")
    return p.stdout.readline()


RESULTS: dict[str, dict] = {}


def report(name, runs, **extra):
    out = {"scenario": name, "repeats": len(runs), **extra}
    for k in runs[0]:
        vals = [r[k] for r in runs]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[k] = vals[0]
            continue
        out[k] = round(statistics.median(vals), 3)
        out[k + "_range"] = [round(min(vals), 3), round(max(vals), 3)]
    RESULTS[name] = out
    print(json.dumps(out), flush=True)


def recorded_steps(c, wid):
    """Step rows of ``wid`` so far (0 while the child has not yet created the schema: on a
    fresh database, replay may be the first scenario that launches)."""
    try:
        return c.execute(
            "SELECT count(*) FROM dbos_agent.steps WHERE workflow_id = %s", (wid,)
        ).fetchone()[0]
    except psycopg.errors.UndefinedTable:
        return 0


def replay_once(a, mode):
    eid = f"replay-{uuid.uuid4().hex[:10]}"
    wid = f"{eid}-wf"
    p = spawn(a, "replay_crash", "--executor-id", eid, "--wid", wid)
    try:
        with psycopg.connect(bench_dsn(a.dsn), autocommit=True) as c:
            end = time.time() + a.child_timeout
            while recorded_steps(c, wid) < a.replay_n:
                if p.poll() is not None:
                    raise RuntimeError(f"replay_crash child exited with {p.returncode}")
                if time.time() > end:
                    raise TimeoutError("replay_crash child never recorded its steps")
                time.sleep(0.02)
    finally:
        kill9(p)
    return child(a, "replay_resume", "--executor-id", eid, "--wid", wid, "--mode", mode)


def recovery_once(a):
    eid = f"recovery-{uuid.uuid4().hex[:10]}"
    p = spawn(a, "recovery_crash", "--executor-id", eid, "--prefix", eid)
    ready = json.loads(read_line(p, a.child_timeout))
    kill9(p)
    r = child(a, "recovery_resume", "--executor-id", eid, "--prefix", eid)
    r["crashed_rss_peak_mb"] = ready["rss_peak_mb"]
    return r


def git_state():
    """The checkout the figures belong to (read-only git queries; {} outside a checkout)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(da.__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", repo, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", repo, "status", "--porcelain"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_head": head, "git_changed_files": len(dirty)} if head else {}


def parent(a):
    if not a.pgbouncer:
        return run_parent(a)
    from dbos_agent._storage.dsn import with_dbname
    from dbos_agent.postgres.opening import open_system_database
    from dbos_agent.postgres.pgbouncer import Pgbouncer

    with psycopg.connect(a.dsn, autocommit=True) as c:
        if a.fresh:
            c.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
            c.execute(f"CREATE DATABASE {BENCH_DB}")
    a.fresh = False
    open_system_database(bench_dsn(a.dsn), create=False, migrate=True, pool_size=1).close()
    with Pgbouncer(a.dsn, pool_size=a.pgbouncer_pool) as bouncer:
        a.app_dsn = bouncer.pooled_url(with_dbname(a.dsn, BENCH_DB))
        return run_parent(a)


def run_parent(a):
    from importlib.metadata import version

    with psycopg.connect(a.dsn, autocommit=True) as c:
        if a.fresh:
            c.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (BENCH_DB,)).fetchone():
            c.execute(f"CREATE DATABASE {BENCH_DB}")
        pg = c.execute("SHOW server_version").fetchone()[0]
        sc = c.execute("SHOW synchronous_commit").fetchone()[0]
    m0 = machine_busy()
    time.sleep(2)
    m1 = machine_busy()
    foreign = (m1[0] - m0[0]) / max(1, m1[1] - m0[1]) * 100 * (os.cpu_count() or 1)
    with psycopg.connect(bench_dsn(a.dsn), autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS bench_ins")
        c.execute("CREATE TABLE bench_ins (id bigserial PRIMARY KEY, k text, v text)")
    print(
        json.dumps(
            {
                "scenario": "meta",
                "dbos_agent": version("dbos-agent"),
                **git_state(),
                "psycopg": psycopg.__version__,
                "python": sys.version.split()[0],
                "postgres": pg,
                "synchronous_commit": sc,
                "cpus": os.cpu_count(),
                # CPU busy over 2 s before any scenario, 100 = one core: others' load
                "machine_cpu_pct_before": round(foreign, 1),
                "dbos_agent_path": da.__file__,
                # where launch() connects: the server, or pgbouncer in transaction mode
                "via": "pgbouncer (transaction mode, one URL)" if a.app_dsn else "direct",
            }
        ),
        flush=True,
    )
    todo = a.scenarios.split(",")
    unknown = set(todo) - set(SCENARIOS)
    if unknown:
        sys.exit(f"unknown scenario(s): {', '.join(sorted(unknown))}; known: {SCENARIOS}")
    R = range(a.repeat)
    if "raw" in todo:
        report("raw_seq_insert_txn", [child(a, "raw") for _ in R], n=a.raw_n)
    if "latency" in todo:
        report("latency", [child(a, "latency") for _ in R], n=a.latency_n, n_100=a.steps100_n)
        raw = RESULTS.get("raw_seq_insert_txn")
        if raw:
            lat = RESULTS["latency"]
            lat["per_step_over_raw_p50"] = round(lat["per_step_ms"] / raw["p50_ms"], 3)
            print(
                json.dumps(
                    {
                        "scenario": "per_step_vs_raw",
                        "per_step_ms": lat["per_step_ms"],
                        "raw_insert_commit_p50_ms": raw["p50_ms"],
                        "ratio": lat["per_step_over_raw_p50"],
                    }
                ),
                flush=True,
            )
    if "throughput_threads" in todo:
        for t in [int(x) for x in a.thread_list.split(",")]:
            a.threads = t
            # each run next to a raw run of as many threads: the machine drifts between
            # minutes, so the ratio is taken pair by pair
            pairs = [(child(a, "raw_threads"), child(a, "throughput_threads")) for _ in R]
            report(f"raw_threads_{t}", [raw for raw, _ in pairs], seconds=a.raw_seconds)
            report(
                f"throughput_threads_{t}",
                [ours for _, ours in pairs],
                workflows=a.workflows,
                steps_per_wf=10,
                pool_size=max(8, t),
            )
            report(
                f"throughput_vs_raw_threads_{t}",
                [
                    {
                        # every durable write: 10 steps, the start and the outcome
                        "writes_over_raw": ours["steps_per_s"] * 1.2 / raw["commits_per_s"],
                        "steps_over_raw": ours["steps_per_s"] / raw["commits_per_s"],
                    }
                    for raw, ours in pairs
                ],
            )
    if "replay" in todo:
        report("replay_call", [replay_once(a, "call") for _ in R], steps=a.replay_n)
        report("replay_recover", [replay_once(a, "recover") for _ in R], steps=a.replay_n)
    if "recovery" in todo:
        report(
            "recovery",
            [recovery_once(a) for _ in R],
            workflows=a.recover_n,
            workers=a.recover_workers or "default",
        )
    if "footprint" in todo:
        report("footprint", [child(a, "footprint") for _ in R], n=a.footprint_n)
    print_table(RESULTS, load_jsonl(a.peer), load_jsonl(a.pg_limit))


# --------------------------------------------------------------------------
# The readable table.


def load_jsonl(path):
    if not path:
        return {}
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                d = json.loads(line)
                if "scenario" in d:
                    out[d["scenario"]] = d
    return out


def _get(res, scen, key):
    v = res.get(scen, {}).get(key)
    return v if isinstance(v, (int, float)) else None


def _fmt(v, digits=3):
    if v is None:
        return "—"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.2f}"


def print_table(ours, peer=None, limit=None):
    """Markdown table: ours | x raw | peer | x raw | ours/peer.

    'x raw' puts a figure against the raw INSERT+COMMIT measured by (a) (ours) or by
    pg_limit's seq_insert_txn when (a) is missing: times in units of one raw commit
    (ms / raw p50 ms), rates as a fraction of the raw sequential commit rate, and
    recovery as time / (10 raw commits per workflow at the raw rate).
    """
    peer, limit = peer or {}, limit or {}
    raw_p50 = _get(ours, "raw_seq_insert_txn", "p50_ms") or _get(limit, "seq_insert_txn", "p50_ms")
    raw_rate = _get(ours, "raw_seq_insert_txn", "per_s") or _get(limit, "seq_insert_txn", "per_s")
    rows = [
        (
            "raw INSERT+COMMIT, one connection: p50 ms",
            "raw_seq_insert_txn",
            "seq_insert_txn",
            "p50_ms",
            "ms",
        ),
        ("raw INSERT+COMMIT: rate /s", "raw_seq_insert_txn", "seq_insert_txn", "per_s", "rate"),
        ("workflow, 0 steps: p50 ms", "latency", "latency", "wf0_p50_ms", "ms"),
        ("workflow, 0 steps: p99 ms", "latency", "latency", "wf0_p99_ms", "ms"),
        ("workflow, 1 step: p50 ms", "latency", "latency", "wf1_p50_ms", "ms"),
        ("workflow, 1 step: p99 ms", "latency", "latency", "wf1_p99_ms", "ms"),
        ("workflow, 100 steps: p50 ms", "latency", "latency", "wf100_p50_ms", "ms"),
        ("per-step overhead, ms", "latency", "latency", "per_step_ms", "ms"),
    ]
    threads = sorted(
        {int(k.rsplit("_", 1)[1]) for k in (*ours, *peer) if k.startswith("throughput_threads_")}
    )
    for t in threads:
        rows.append(
            (
                f"1000x10-step wf, {t} threads: wf/s",
                f"throughput_threads_{t}",
                f"throughput_threads_{t}",
                "workflows_per_s",
                None,
            )
        )
        rows.append(
            (
                f"... {t} threads: steps/s",
                f"throughput_threads_{t}",
                f"throughput_threads_{t}",
                "steps_per_s",
                "rate",
            )
        )
    n_replay = _get(ours, "replay_call", "steps") or _get(ours, "replay_recover", "steps") or 1000
    n_rec = _get(ours, "recovery", "workflows") or 1000
    rows += [
        (
            f"replay {n_replay} steps after kill -9 (re-call): ms",
            "replay_call",
            None,
            "replay_ms",
            "ms",
        ),
        (
            f"replay {n_replay} steps (recovery): launch -> live step, ms",
            "replay_recover",
            None,
            "launch_to_live_step_ms",
            "ms",
        ),
        (f"recovery of {n_rec} killed wfs: launch() s", "recovery", "recovery", "launch_s", None),
        (
            f"... launch -> all {n_rec} SUCCESS, s",
            "recovery",
            "recovery",
            "recover_all_s",
            "recovery",
        ),
    ]
    for label, key in (
        ("rows inserted", "rows_ins"),
        ("rows updated", "rows_upd"),
        ("write txns (xids)", "write_txns"),
        ("committed txns", "all_txns"),
        ("WAL bytes", "wal_bytes"),
        ("table+index bytes", "table_bytes"),
    ):
        rows.append(
            (f"footprint per step: {label}", "footprint", "footprint", f"{key}_per_step", None)
        )
    for label, key in (
        ("write txns", "write_txns"),
        ("committed txns", "all_txns"),
        ("rows inserted", "rows_ins"),
        ("rows updated", "rows_upd"),
        ("WAL bytes", "wal_bytes"),
    ):
        rows.append(
            (f"footprint per 1-step wf: {label}", "footprint", "footprint", f"{key}_per_wf1", None)
        )
    rows.append(("peak RSS MB, sequential (latency)", "latency", "latency", "rss_peak_mb", None))
    rows.append(("peak RSS MB, recovering 1000", "recovery", "recovery", "rss_peak_mb", None))

    def ratio(v, kind):
        if v is None or kind is None:
            return None
        if kind == "ms" and raw_p50:
            return v / raw_p50
        if kind == "rate" and raw_rate:
            return v / raw_rate
        if kind == "recovery" and raw_rate:
            return v / (10 * n_rec / raw_rate)
        return None

    print()
    print("| scenario | dbos_agent | x raw | DBOS peer | x raw | dbos_agent / peer |")
    print("|---|---|---|---|---|---|")
    for label, scen, peer_scen, key, kind in rows:
        if scen == "raw_seq_insert_txn":  # ours (a) vs pg_limit's figure, if given
            o, p = _get(ours, scen, key), _get(limit, peer_scen, key)
        else:
            o = _get(ours, scen, key)
            p = _get(peer, peer_scen, key) if peer_scen else None
        if o is None and p is None:
            continue
        rel = o / p if (o is not None and p) else None
        rng = ours.get(scen, {}).get(key + "_range")
        o_txt = _fmt(o) + (f" [{_fmt(rng[0])}-{_fmt(rng[1])}]" if rng and rng[0] != rng[1] else "")
        rp = ratio(p, kind)
        print(
            f"| {label} | {o_txt} | {_fmt(ratio(o, kind))} | {_fmt(p)} | {_fmt(rp)} | {_fmt(rel)} |"
        )
    print()
    print(
        "x raw: times / raw INSERT+COMMIT p50; rates / raw sequential commits per second;"
        " recovery / (10 raw commits per workflow). The raw row's peer column is"
        " pg_limit.py's seq_insert_txn (--pg-limit), if given."
    )


SCENARIOS = ("raw", "latency", "throughput_threads", "replay", "recovery", "footprint")


def main():
    global ROLE
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dsn", help="Postgres URL or conninfo of the server to use")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--raw-n", type=int, default=3000, help="txns of the raw scenario")
    ap.add_argument(
        "--raw-seconds",
        type=float,
        default=5.0,
        help="seconds of each raw T-thread run beside throughput_threads",
    )
    ap.add_argument("--latency-n", type=int, default=300)
    ap.add_argument("--steps100-n", type=int, default=30)
    ap.add_argument("--workflows", type=int, default=1000, help="throughput workflows")
    ap.add_argument("--thread-list", default="8,64")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--replay-n", type=int, default=1000)
    ap.add_argument("--recover-n", type=int, default=1000)
    ap.add_argument(
        "--recover-workers",
        type=int,
        default=0,
        help="workers of the recovering process (0 = launch() default)",
    )
    ap.add_argument("--footprint-n", type=int, default=50)
    ap.add_argument(
        "--stats-sleep",
        type=float,
        default=11.0,
        help="seconds before each footprint snapshot (stats flush)",
    )
    ap.add_argument("--child-timeout", type=float, default=900)
    ap.add_argument("--no-fresh", dest="fresh", action="store_false")
    ap.add_argument("--profile", help="directory for one cProfile dump per child")
    ap.add_argument("--peer", help="peer_dbos.py output (JSON lines) for the table")
    ap.add_argument("--pg-limit", help="pg_limit.py output (JSON lines) for the table")
    ap.add_argument("--report", help="print the table from this script's saved output; no run")
    ap.add_argument(
        "--pgbouncer",
        action="store_true",
        help="run the library through pgbouncer in transaction mode, started in front of --dsn",
    )
    ap.add_argument("--pgbouncer-pool", type=int, default=20, help="its server connections")
    ap.add_argument("--app-dsn", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--role", default="parent", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    ap.add_argument("--executor-id", help=argparse.SUPPRESS)
    ap.add_argument("--wid", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    a = ap.parse_args()
    ROLE = a.role
    if a.report:
        return print_table(load_jsonl(a.report), load_jsonl(a.peer), load_jsonl(a.pg_limit))
    if not a.dsn:
        ap.error("--dsn is required")
    if ROLE == "parent":
        return parent(a)
    fn = globals()[f"role_{ROLE}"]
    if a.profile and not ROLE.endswith("_crash"):
        import cProfile

        os.makedirs(a.profile, exist_ok=True)
        prof = cProfile.Profile()
        out = prof.runcall(fn, a)
        prof.dump_stats(os.path.join(a.profile, f"{ROLE}-{a.threads}-{os.getpid()}.prof"))
    else:
        out = fn(a)
    print(json.dumps(out), flush=True)
    with contextlib.suppress(da.errors.NotLaunchedError):
        da.current_runtime().shutdown(grace=2)  # close the pool's connections cleanly
    os._exit(0)  # don't wait on worker threads; shutdown is not what is measured


if __name__ == "__main__":
    main()
