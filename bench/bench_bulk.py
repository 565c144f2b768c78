#!/usr/bin/env python3
"""Bulk operations over 100,000 workflows, and send_bulk against as many sends.

    python bench/bench_bulk.py                      # a throwaway local cluster of its own
    python bench/bench_bulk.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python bench/bench_bulk.py --workflows 20000 --messages 2000   # a quick look

The database ``dbos_agent_bench_bulk`` on the DSN's server is dropped and created,
migrated by dbos_agent, and filled by INSERT ... SELECT generate_series with
``--workflows`` (default 100,000) PENDING workflows of no process (``bench_bulk.job``),
then VACUUM ANALYZEd. Through a ``da.Client`` (nothing else runs):

  cancel   Client.cancel_workflows(where=WorkflowFilter(name="bench_bulk.job")).
  resume   Client.resume_workflows(where=WorkflowFilter(name=..., status=CANCELLED)).
  cancel2  the same cancel again (what delete needs: finished workflows).
  delete   Client.delete_workflows(where=WorkflowFilter(name=...)).
  send     ``--messages`` (default 10,000) messages to 100 workflows: one Client.send each,
           then one Client.send_bulk of as many (other keys), on the same workflows.

Each line: seconds, workflows (or messages) per second, and the statements sent (a
bulk report's count: one that read the filter's ids, one per batch of 1,000; a send is
one statement, a send_bulk one), each its own transaction.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

import dbos_agent as da
from dbos_agent.postgres.throwaway import LocalCluster
from dbos_agent.records import WorkflowFilter

DB_NAME = "dbos_agent_bench_bulk"
NAME = "bench_bulk.job"
FILL = """INSERT INTO dbos_agent.workflows
    (workflow_id, name, status, inputs, executor_id, max_recovery_attempts, created_at)
SELECT 'bulk-' || lpad(i::text, 7, '0'), %(name)s, 'PENDING', '{}', 'bench-bulk', 50,
       now() - interval '1 hour' + i * interval '1 ms'
FROM generate_series(1, %(n)s) AS i"""


def _database(server_url: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DB_NAME)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))
    return server_url.rsplit("/", 1)[0] + "/" + DB_NAME


def _measure(label: str, count: int, statements: int | None, act: Callable[[], Any]) -> float:
    """Run ``act``; print its time, rate and statements (a bulk report's own count)."""
    started = time.perf_counter()
    result = act()
    seconds = time.perf_counter() - started
    line: dict[str, Any] = {"scenario": label, "items": count, "seconds": round(seconds, 3)}
    line["per_second"] = round(count / seconds)
    if isinstance(result, da.operations.BulkReport):
        line |= {"matched": result.matched, "changed": result.changed}
        statements = result.statements
    line["statements"] = statements
    print(json.dumps(line), flush=True)
    return seconds


def run(server_url: str, workflows: int, messages: int) -> None:
    url = _database(server_url)
    with da.Client(url, migrate=True) as client:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FILL, {"name": NAME, "n": workflows})
            conn.execute("VACUUM ANALYZE dbos_agent.workflows")
        print(json.dumps({"meta": {"workflows": workflows, "messages": messages}}), flush=True)
        mine = WorkflowFilter(name=NAME)
        cancelled = WorkflowFilter(name=NAME, status=da.WorkflowStatus.CANCELLED)
        _measure("cancel", workflows, None, lambda: client.cancel_workflows(where=mine))
        _measure("resume", workflows, None, lambda: client.resume_workflows(where=cancelled))
        _measure("cancel2", workflows, None, lambda: client.cancel_workflows(where=mine))
        _measure("delete", workflows, None, lambda: client.delete_workflows(where=mine))

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FILL, {"name": NAME, "n": 100})
        targets = [f"bulk-{i:07d}" for i in range(1, 101)]
        batch = [(targets[i % 100], {"n": i}, "t") for i in range(messages)]

        def one_by_one() -> None:
            for destination, message, topic in batch:
                client.send(destination, message, topic)

        single = _measure("send x N", messages, messages, one_by_one)
        bulk = _measure("send_bulk", messages, 1, lambda: client.send_bulk(batch))
        ratio = single / bulk
        print(json.dumps({"send_bulk_speedup": round(ratio, 1)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="a server to use (default: a throwaway local cluster)")
    parser.add_argument("--workflows", type=int, default=100_000)
    parser.add_argument("--messages", type=int, default=10_000)
    args = parser.parse_args()
    if args.dsn:
        run(args.dsn, args.workflows, args.messages)
        return
    with LocalCluster.start() as cluster:
        run(cluster.url, args.workflows, args.messages)


if __name__ == "__main__":
    main()
