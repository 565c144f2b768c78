#!/usr/bin/env python3
"""`dbos-agent serve` against clients that hold its resources: what its memory, its open
files and its other answers do (issue 29's reproduction, at any size).

    python bench/bench_web_streams.py [--dsn postgresql://postgres@127.0.0.1:55432/postgres]

Without ``--dsn`` it starts a throwaway local Postgres. A workflow writes a stream of
``--items`` items of ``--item-bytes`` each (default 300 x 64 KiB, 19 MB); then each phase
runs against a fresh ``dbos-agent serve`` subprocess (extra options: ``--serve-option``,
repeatable), measured from outside (VmRSS and VmHWM, open files from /proc):

1. never-reading: ``--clients`` raw sockets ask for the stream and never read; for
   ``--hold`` seconds a ``GET /api/workflows/ID`` is timed every second (its status
   counted); then they close, and the RSS is read ``--settle`` seconds later.
2. reading: ``--readers`` clients read the whole stream at once (threads); peak RSS.
3. leaving: ``--clients`` readers each read 256 KiB of the stream, then reset their
   connection (the server is writing to it).
4. slow: ``--slow`` sockets each send half a request line and nothing more; how many the
   server has closed after ``--slow-wait`` seconds, and its open files meanwhile.

Each phase also counts the server's stderr lines (``socket.send() raised exception.``
among them). One JSON line per phase.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dbos_agent as da
from dbos_agent.testing.databases import scratch_database
from tests.support.web_load import Served, closed_by_peer


@da.durable_workflow(name="bench_web_big_stream")
def big_stream(items: int, size: int) -> int:
    for i in range(items):
        da.write_stream("big", f"{i:08d}" + "x" * (size - 8))
    return items


def stream_path(wid: str) -> str:
    return f"/api/workflows/{wid}/streams/big"


def never_reading(url: str, wid: str, args: argparse.Namespace) -> dict[str, Any]:
    with Served(url, *args.serve_option) as server:
        server.get(f"/api/workflows/{wid}")  # warm: the first request's imports
        before = server.rss_mb()
        socks = []
        for _ in range(args.clients):
            sock = server.connect()
            sock.sendall(server.head(stream_path(wid)))
            socks.append(sock)
        latencies, statuses = [], Counter[int]()
        end = time.monotonic() + args.hold
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                status, _ = server.get(f"/api/workflows/{wid}")
            except OSError:
                status = 0
            latencies.append(time.monotonic() - started)
            statuses[status] += 1
            time.sleep(max(0.0, 1 - (time.monotonic() - started)))
        during, peak, files_during = server.rss_mb(), server.peak_rss_mb(), server.open_files()
        for sock in socks:
            sock.close()
        time.sleep(args.settle)
        after = server.rss_mb()
        files_after = server.open_files()
        errors = server.output()
    return {
        "phase": "never_reading",
        "clients": args.clients,
        "rss_before_mb": round(before),
        "rss_during_mb": round(during),
        "rss_peak_mb": round(peak),
        "rss_after_mb": round(after),
        "open_files_during": files_during,
        "open_files_after": files_after,
        "other_request_max_s": round(max(latencies), 2),
        "other_request_statuses": dict(statuses),
        "stderr_lines": errors.count("\n") - 1,
        "send_raised_lines": errors.count("socket.send() raised exception."),
    }


def reading(url: str, wid: str, args: argparse.Namespace) -> dict[str, Any]:
    with Served(url, *args.serve_option) as server:
        server.get(f"/api/workflows/{wid}")
        before = server.rss_mb()
        got: list[int] = []

        def read_all() -> None:
            status, body = server.get(stream_path(wid))
            got.append(body.count(b"event: value") if status == 200 else -status)

        threads = [threading.Thread(target=read_all) for _ in range(args.readers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        peak = server.peak_rss_mb()
        errors = server.output()
    return {
        "phase": "reading",
        "readers": args.readers,
        "rss_before_mb": round(before),
        "rss_peak_mb": round(peak),
        "items_read": dict(Counter(got)),
        "stderr_lines": errors.count("\n") - 1,
    }


def leaving(url: str, wid: str, args: argparse.Namespace) -> dict[str, Any]:
    with Served(url, *args.serve_option) as server:
        socks = []
        for _ in range(args.clients):
            sock = server.connect()
            sock.sendall(server.head(stream_path(wid)))
            socks.append(sock)
        for sock in socks:
            got = 0
            while got < 256 * 1024 and (chunk := sock.recv(65536)):
                got += len(chunk)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        time.sleep(args.settle)
        errors = server.output()
    return {
        "phase": "leaving",
        "clients": args.clients,
        "stderr_lines": errors.count("\n") - 1,
        "send_raised_lines": errors.count("socket.send() raised exception."),
    }


def slow(url: str, args: argparse.Namespace) -> dict[str, Any]:
    with Served(url, *args.serve_option) as server:
        files_before = server.open_files()
        socks = []
        for _ in range(args.slow):
            sock = server.connect()
            sock.sendall(b"GET /api/workflows HTT")
            socks.append(sock)
        files_during = server.open_files()
        time.sleep(args.slow_wait)
        closed = sum(closed_by_peer(sock) for sock in socks)
        files_after = server.open_files()
        for sock in socks:
            sock.close()
        errors = server.output()
    return {
        "phase": "slow",
        "connections": args.slow,
        "wait_s": args.slow_wait,
        "closed_by_server": closed,
        "open_files_before": files_before,
        "open_files_during": files_during,
        "open_files_after_wait": files_after,
        "stderr_lines": errors.count("\n") - 1,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn")
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--item-bytes", type=int, default=64 * 1024)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--hold", type=float, default=40)
    parser.add_argument("--settle", type=float, default=10)
    parser.add_argument("--readers", type=int, default=20)
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--slow-wait", type=float, default=30)
    parser.add_argument("--phases", default="never_reading,reading,leaving,slow")
    parser.add_argument("--serve-option", action="append", default=[])
    args = parser.parse_args()
    socket.setdefaulttimeout(120)
    with scratch_database(args.dsn) as url:
        with da.launch(url, executor_id="bench-web-streams"):
            wid = da.start(big_stream, args.items, args.item_bytes).workflow_id
            da.retrieve(wid).result(timeout=600)
        phases = args.phases.split(",")
        if "never_reading" in phases:
            print(json.dumps(never_reading(url, wid, args)), flush=True)
        if "reading" in phases:
            print(json.dumps(reading(url, wid, args)), flush=True)
        if "leaving" in phases:
            print(json.dumps(leaving(url, wid, args)), flush=True)
        if "slow" in phases:
            print(json.dumps(slow(url, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
