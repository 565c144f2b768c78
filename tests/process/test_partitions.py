"""A partitioned queue served by three worker processes, one killed with SIGKILL mid-way:
each tenant's limits hold at every moment (counted from outside the processes, in a
table each workflow's step enters and leaves), and every workflow finishes once.

A take-over is not a dequeue: the survivor that claims the killed worker's workflows
runs them whatever its own worker limit says (true of every queue), so that limit is
counted over dequeued runs only; the tenant's global limit is counted over all of them.
"""

from __future__ import annotations

import signal
import subprocess
from collections import defaultdict
from datetime import datetime

import psycopg

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until
from tests.processes import start_worker, stop_workers

#: Heavy tenants with more waiting than their limits let run, and light ones: the free
#: slots (3 workers x 4) are more than a tenant may use, so only the limits hold it back.
WORKLOAD = {**{f"heavy-{i}": 15 for i in range(4)}, **{f"light-{i:02d}": 2 for i in range(10)}}


def _worker(url: str) -> subprocess.Popen[str]:
    env = {"PARTITION_APP_STEP_SECONDS": "0.2"}
    return start_worker(
        url, "tests.apps.partition_app", "--quiet", "--lease", "1.5", "--workers", "4", env=env
    )


def _entries(url: str) -> list[tuple[str, str, int, datetime, datetime | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, tenant, pid, entered_at, left_at FROM partition_entries"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def _most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one moment (one that ends as another starts: not both)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_tenant_limits_hold_across_three_workers_and_a_kill(dbos_agent_database_url: str) -> None:
    url = dbos_agent_database_url
    da.Client(url, migrate=True).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE partition_entries (id bigserial PRIMARY KEY, workflow_id text,"
            " tenant text, pid integer, entered_at timestamptz, left_at timestamptz)"
        )
    ids = {new_id(t): t for t, count in WORKLOAD.items() for _ in range(count)}
    workers = [_worker(url) for _ in range(3)]
    try:
        with da.Client(url) as client:
            for wid, tenant in ids.items():
                client.enqueue(
                    "partition-tests", "tenant_job", tenant, workflow_id=wid, partition_key=tenant
                )
        victim = workers[0]
        wait_until(
            lambda: len(_entries(url)) >= len(ids) // 2,  # every worker in the thick of it
            60,
            "half the workflows to start",
            every=0.02,
        )
        victim.send_signal(signal.SIGKILL)  # dead from here on: the clock read after is later
        with psycopg.connect(url) as conn:
            killed_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        victim.wait(10)

        def all_done() -> bool:
            with Inspector(url) as db:
                statuses = db.statuses(list(ids))
            return all(s is da.WorkflowStatus.SUCCESS for s in statuses.values())

        wait_until(all_done, 120, f"{len(ids)} workflows to succeed")
    finally:
        stop_workers(workers)

    entries = _entries(url)
    by_tenant: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    by_worker: dict[tuple[str, int], list[tuple[datetime, datetime]]] = defaultdict(list)
    finished: dict[str, list[int]] = defaultdict(list)
    # a survivor's take-over of the victim's workflows is not a dequeue: it claims them
    # whatever its worker limit (as for any queue), so only dequeued runs count there. Taken
    # over: what the victim held, whether it had entered the step or not (dequeued, then
    # killed before its first statement), which the take-over counted as a recovery.
    with Inspector(url) as db:
        recovered = {w for w in ids if (i := db.workflow(w)) and i.recovery_attempts > 0}
    taken_over = recovered | {e[0] for e in entries if e[2] == victim.pid}
    for wid, tenant, pid, entered, left in entries:
        assert left is not None or pid == victim.pid, (wid, pid)  # only the killed one stops
        span = (entered, left if left is not None else killed_at)
        by_tenant[tenant].append(span)
        if pid == victim.pid or wid not in taken_over:
            by_worker[(tenant, pid)].append(span)
        if left is not None:
            finished[wid].append(pid)
    assert {t: _most_at_once(s) for t, s in by_tenant.items() if _most_at_once(s) > 2} == {}
    assert {k: _most_at_once(s) for k, s in by_worker.items() if _most_at_once(s) > 1} == {}
    # every workflow's step ended once, except that the victim may have ended one whose
    # checkpoint it had not written when it died (then a survivor ran it again)
    assert set(finished) == set(ids)
    twice = {w: pids for w, pids in finished.items() if len(pids) > 1}
    assert all(len(p) == 2 and victim.pid in p for p in twice.values()), twice
    with Inspector(url) as db:
        for wid, tenant in ids.items():
            info = db.workflow(wid)
            assert info is not None and info.output == tenant and info.partition_key == tenant
            assert [s.seq for s in db.steps(wid)] == [0]
    assert len({e[2] for e in entries}) == 3  # all three workers served the tenants
