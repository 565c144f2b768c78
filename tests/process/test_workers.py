"""Worker daemons as real processes on one database: take-over after kill -9, SIGTERM,
global queue limits across workers, application versions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import direct_and_pooled, new_id, wait_until
from tests.processes import assert_never_two_at_once, kill9, start_worker, stop_workers
from tests.processes import executions as _executions
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]


def _worker(url: str, log: Path, *extra: str, step_seconds: float = 0.1) -> subprocess.Popen[str]:
    env = {"WORKER_APP_LOG": str(log), "WORKER_APP_STEP_SECONDS": str(step_seconds)}
    return start_worker(url, "tests.apps.worker_app", "--quiet", *extra, env=env)


def _statuses(url: str, ids: list[str]) -> dict[str, str]:
    with Inspector(url) as db:
        return {wid: str(s) for wid, s in db.statuses(ids).items() if s is not None}


def _wait_all(url: str, ids: list[str], timeout: float) -> dict[str, str]:
    def all_succeeded() -> bool:
        statuses = _statuses(url, ids)
        return len(statuses) == len(ids) and set(statuses.values()) == {"SUCCESS"}

    wait_until(all_succeeded, timeout, f"{len(ids)} workflows to succeed")
    return _statuses(url, ids)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    stop_workers(procs)


@direct_and_pooled
def test_three_workers_one_killed_mid_way_all_workflows_finish_once(
    database_url: str, tmp_path: Path
) -> None:
    url, log = database_url, tmp_path / "steps.log"
    log.touch()
    ids = [new_id("fleet") for _ in range(50)]
    workers = [_worker(url, log, "--lease", "1.5", "--workers", "4") for _ in range(3)]
    try:
        with da.Client(url) as client:
            for wid in ids:
                client.enqueue("worker-tests", "job", 5, workflow_id=wid)
        victim = workers[0]
        wait_until(
            lambda: sum(1 for r in _executions(log) if r[0] == victim.pid) >= 6,
            30,
            "the victim to be mid-way",
            every=0.02,
        )
        killed_at = kill9(victim)
        statuses = _wait_all(url, ids, 60)
    finally:
        _stop(workers)
    assert set(statuses.values()) == {"SUCCESS"}, statuses
    with Inspector(url) as db:
        seqs = {wid: [s.seq for s in db.steps(wid)] for wid in ids}
        results = {wid: info.output for wid in ids if (info := db.workflow(wid)) is not None}
    assert len(seqs) == 50 and all(s == [0, 1, 2, 3, 4] for s in seqs.values()), seqs
    assert len(results) == 50 and set(results.values()) == {10}

    # At no moment did two executors run the same workflow.
    taken_over = assert_never_two_at_once(_executions(log), victim.pid, killed_at)
    assert taken_over >= 1  # the victim's unfinished workflows were finished by others


def test_sigterm_is_graceful_and_the_next_worker_takes_over_at_once(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, log = dbos_agent_database_url, tmp_path / "steps.log"
    log.touch()
    wid = new_id("graceful")
    first = _worker(url, log, "--lease", "3600", step_seconds=0.3)
    try:
        with da.Client(url) as client:
            client.enqueue("worker-tests", "job", 10, workflow_id=wid)
        wait_until(lambda: len(_executions(log)) >= 2, 20, "two steps", every=0.02)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=20) == 0
        assert _statuses(url, [wid])[wid] == "PENDING"
        done_before = len(_executions(log))
        # an hour's lease, yet the next worker need not wait: the first one exited cleanly
        second = _worker(url, log, "--lease", "3600", step_seconds=0.05)
        try:
            assert _wait_all(url, [wid], 120)[wid] == "SUCCESS"
        finally:
            _stop([second])
    finally:
        _stop([first])
    seqs = [seq for _, w, seq, _, _ in _executions(log) if w == wid]
    assert sorted(seqs) == list(range(10)), "each step ran exactly once"
    assert done_before >= 2


def test_an_executor_only_recovers_its_application_version(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, log = dbos_agent_database_url, tmp_path / "steps.log"
    log.touch()
    wid, control = new_id("versioned"), new_id("versioned-v2")
    da.Client(url).close()  # the schema (run alone, no test before has migrated it)
    with psycopg.connect(url, autocommit=True) as conn:
        for workflow_id, version in ((wid, "v1"), (control, "v2")):
            conn.execute(
                "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs,"
                " executor_id, app_version, max_recovery_attempts)"
                " VALUES (%s, 'job', 'PENDING', '{\"steps\": 2}', 'gone-executor', %s, 5)",
                (workflow_id, version),
            )
    other = _worker(url, log, "--app-version", "v2", "--lease", "0.5")
    try:
        # the v2 orphan beside it is taken over in the same pass (one claim statement):
        # once it is done, that pass has passed the v1 workflow over
        assert _wait_all(url, [control], 20)[control] == "SUCCESS"
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT status, executor_id, recovery_attempts FROM dbos_agent.workflows"
                " WHERE workflow_id = %s",
                (wid,),
            ).fetchone()
        assert row == ("PENDING", "gone-executor", 0), "a worker of v2 took the v1 workflow"
    finally:
        _stop([other])
    same = _worker(url, log, "--app-version", "v1", "--lease", "0.5")
    try:
        assert _wait_all(url, [wid], 20)[wid] == "SUCCESS"
    finally:
        _stop([same])


@pytest.mark.parametrize("spec", ["tests.no_such_module", "tests.apps.worker_app:missing"])
def test_a_bad_app_is_a_clear_error(dbos_agent_database_url: str, spec: str) -> None:
    env = dict(os.environ, DBOS_AGENT_DATABASE_URL=dbos_agent_database_url, PYTHONPATH=str(ROOT))
    done = zygote.run(
        [sys.executable, "-m", "dbos_agent.worker", "--app", spec],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("dbos-agent: error:") and "Traceback" not in done.stderr


def test_a_global_concurrency_limit_holds_across_workers(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, log = dbos_agent_database_url, tmp_path / "steps.log"
    log.touch()
    ids = [new_id("limited") for _ in range(10)]
    workers = [_worker(url, log, "--workers", "4", step_seconds=0.1) for _ in range(3)]
    try:
        with da.Client(url) as client:
            for wid in ids:
                client.enqueue("worker-tests-limited", "job", 2, workflow_id=wid)
        statuses = _wait_all(url, ids, 60)
    finally:
        _stop(workers)
    assert set(statuses.values()) == {"SUCCESS"}
    spans: dict[str, list[float]] = {}
    for _pid, wid, _seq, start, end in _executions(log):
        span = spans.setdefault(wid, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    events = sorted([(s, 1) for s, _ in spans.values()] + [(e, -1) for _, e in spans.values()])
    in_flight = peak = 0
    for _, delta in events:
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak == 2, f"at most 2 workflows of the queue may run at once, saw {peak}"


def test_workers_share_a_limited_queue_fairly(dbos_agent_database_url: str, tmp_path: Path) -> None:
    """A queue limited to 4 in flight, two workers with room for 16 each: each takes its
    share (2), instead of whichever dispatches first taking all 4 again and again."""
    url, log = dbos_agent_database_url, tmp_path / "steps.log"
    log.touch()
    ids = [new_id("fair") for _ in range(24)]
    workers = [_worker(url, log, step_seconds=0.1) for _ in range(2)]
    try:
        wait_until(lambda: len(_queue_servers(url)) >= 2, 30, "both workers serving the queue")
        with da.Client(url) as client:
            for wid in ids:
                client.enqueue("worker-tests-fair", "job", 2, workflow_id=wid)
        _wait_all(url, ids, 90)
    finally:
        _stop(workers)
    by_worker: dict[int, set[str]] = defaultdict(set)
    for pid, wid, _seq, _start, _end in _executions(log):
        by_worker[pid].add(wid)
    shares = sorted(len(wids) for wids in by_worker.values())
    assert len(shares) == 2 and shares[0] >= 8, f"workflows per worker: {shares}"


def _queue_servers(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('dbos_agent.executors')").fetchone() == (None,):
            return []  # no worker has created the schema yet
        rows = conn.execute(
            "SELECT session_key FROM dbos_agent.executors "
            "WHERE 'worker-tests-fair' = ANY(queues) AND heartbeat_at > now() - interval '10s'"
        ).fetchall()
    return [row[0] for row in rows]
