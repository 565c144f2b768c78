#!/usr/bin/env python3
"""Async agents on one event loop: N background async workflows, each one model call.

    python bench/bench_async_agents.py --dsn postgresql://postgres@127.0.0.1:55432/postgres \
        --n 500,2000 --delay 1.0

For each N, a child process launches dbos_agent (``workers=16``), starts N ``async def``
workflows with ``da.start``, each making one ``await Model.create_async(...)`` against the
local scripted Messages API server (in the parent process), whose every reply takes
``--delay`` seconds. Reported:
the time until all N finished (one thread per workflow from a pool of 16 would need
N / 16 x delay; in series N x delay), the child's peak RSS and threads (read from /proc
while it runs), and how many requests the server saw (each exactly once).

It uses a fresh database on the DSN's server (``dbos_agent.testing.fresh_database``),
dropped at the end. One JSON line per N, then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anthropic

import dbos_agent as da
from dbos_agent.agent import Model
from dbos_agent.agent.scripted_server import Delay, Reply, ScriptedServer, text
from dbos_agent.testing import fresh_database

MODEL: dict[str, Model] = {}


@da.durable_workflow(name="bench_async_agent")
async def agent(i: int) -> str:
    reply = await MODEL["model"].create_async([{"role": "user", "content": f"agent {i}"}])
    return "".join(block.text for block in reply.content if block.type == "text")


def proc_status(pid: int) -> tuple[float, int]:
    """RSS (MB) and threads of a process, from /proc."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def child(url: str, model_url: str, n: int, prefix: str) -> None:
    MODEL["model"] = Model(anthropic.Anthropic(base_url=model_url, api_key="bench"))
    with da.launch(url, executor_id=f"bench-async-{prefix}", workers=16):
        started = time.monotonic()
        handles = [da.start(agent, i, workflow_id=f"{prefix}-{i}") for i in range(n)]
        results = [h.result(timeout=600) for h in handles]
        elapsed = time.monotonic() - started
    assert results == ["done"] * n
    print(json.dumps({"elapsed_s": elapsed}), flush=True)


def run(url: str, n: int, delay: float) -> dict[str, Any]:
    script = lambda body: Delay(delay, Reply((text("done"),)))  # noqa: E731
    with ScriptedServer(script) as server:  # here, so its threads are not the child's
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", url, server.url, str(n), f"n{n}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        peak = [0.0, 0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                try:
                    rss, threads = proc_status(proc.pid)
                except (OSError, KeyError):
                    return
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], threads)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, _ = proc.communicate()
        done.set()
        sampler.join()
        requests = len(server.requests)
    figures = json.loads(out.strip().splitlines()[-1])
    return {
        "n": n,
        "delay_s": delay,
        "all_done_s": round(figures["elapsed_s"], 2),
        "model_requests": requests,
        "thread_per_workflow_s": round(n / 16 * delay, 1),
        "peak_rss_mb": round(peak[0], 1),
        "peak_threads": peak[1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:55432/postgres")
    parser.add_argument("--n", default="500,2000", help="comma-separated workflow counts")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds per model reply")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, model_url, n, prefix = args.child
        child(url, model_url, int(n), prefix)
        return 0

    rows = []
    with fresh_database(args.dsn) as url:
        da.Client(url).close()  # apply the schema before the clock starts
        for n in (int(part) for part in args.n.split(",")):
            rows.append(run(url, n, args.delay))
            print(json.dumps(rows[-1]), flush=True)
    print("\n| N | all done | 16 threads would need | peak RSS | peak threads | requests |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:,} | {r['all_done_s']} s | {r['thread_per_workflow_s']} s "
            f"| {r['peak_rss_mb']} MB | {r['peak_threads']} | {r['model_requests']:,} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
