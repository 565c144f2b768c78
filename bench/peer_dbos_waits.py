#!/usr/bin/env python3
"""Peer benchmark: the waits of bench_suspension.py on DBOS Transact 3.x.

N workflows each wait in ``DBOS.recv("go")``; once all wait, messages are sent to
them (at full speed from 4 threads, or at ``--rate`` per second) and each records the
time from its send to its next step. Reported as bench_suspension.py does: time to
park, peak RSS and threads of the process, resumptions/s and send -> resumed p50/p99.
DBOS runs one thread per waiting workflow. Run it with the peer's interpreter (dbos
must not be installed beside dbos_agent), one N per process:

    $PEER_PY bench/peer_dbos_waits.py --dsn postgresql://postgres@127.0.0.1:55432/postgres --n 1000
    $PEER_PY bench/peer_dbos_waits.py --dsn ... --n 10000 --rate 1000

The system database is <dsn's server>/dbos_peer_waits, dropped at start.
"""

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SYS_DB = "dbos_peer_waits"
PARKED = [0]
PARKED_LOCK = threading.Lock()

from dbos import DBOS, SetWorkflowID  # noqa: E402


@DBOS.step()
def resumed(sent_at: float) -> float:
    return time.time() - sent_at


@DBOS.workflow()
def parked(i: int) -> float:
    with PARKED_LOCK:
        PARKED[0] += 1
    message = DBOS.recv("go", timeout_seconds=3600)
    return resumed(float(message["sent"]))


def proc_status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
        elif key == "Threads":
            out[key] = int(value)
    return out


def pct(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:55432/postgres")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=None, help="sends per second")
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {SYS_DB} WITH (FORCE)")
    d = conninfo_to_dict(make_conninfo(args.dsn))
    url = (
        f"postgresql://{d.get('user', 'postgres')}@{d.get('host', '127.0.0.1')}:"
        f"{d.get('port', 5432)}/{SYS_DB}"
    )
    DBOS(config={"name": "peer-waits", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()

    started = time.monotonic()
    handles = []
    for i in range(args.n):
        with SetWorkflowID(f"wait-{i}"):
            handles.append(DBOS.start_workflow(parked, i))
    peak_threads = 0
    while PARKED[0] < args.n:
        peak_threads = max(peak_threads, proc_status()["Threads"])
        time.sleep(0.05)
    time.sleep(0.5)  # let the last ones enter recv
    park_s = time.monotonic() - started
    status = proc_status()
    parked_stats = {
        "phase": "park",
        "n": args.n,
        "park_s": round(park_s, 2),
        "parked_per_s": round(args.n / park_s),
        "peak_rss_mb": status["VmHWM"],
        "threads": max(peak_threads, status["Threads"]),
    }
    print(json.dumps(parked_stats), flush=True)

    sends_started = time.monotonic()

    def sender(part: int, threads: int) -> None:
        for i in range(part, args.n, threads):
            if args.rate:
                pause = sends_started + i / args.rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            DBOS.send(f"wait-{i}", {"sent": time.time()}, topic="go")

    senders = [threading.Thread(target=sender, args=(k, 4)) for k in range(4)]
    for s in senders:
        s.start()
    for s in senders:
        s.join()
    send_s = time.monotonic() - sends_started
    latencies = [h.get_result() for h in handles]
    total_s = time.monotonic() - sends_started
    print(
        json.dumps(
            {
                "phase": "wake",
                "n": args.n,
                "rate": args.rate or "full",
                "send_s": round(send_s, 2),
                "all_resumed_s": round(total_s, 2),
                "resumptions_per_s": round(args.n / total_s),
                "p50_ms": round(statistics.median(latencies) * 1e3, 1),
                "p99_ms": round(pct(latencies, 99) * 1e3, 1),
                "peak_rss_mb": proc_status()["VmHWM"],
            }
        ),
        flush=True,
    )
    DBOS.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
