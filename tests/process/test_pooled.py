"""A fleet through pgbouncer in transaction mode (issue 33): processes that reach the
server only through the pooler (their session judged by its lease, wake-ups polled), or
through it with a direct session URL beside it (the lock and LISTEN there), run, wait,
are woken, die and are taken over like a fleet on direct connections: every workflow
finishes, every step runs once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import dbos_agent as da
from tests.helpers import wait_until
from tests.processes import ROOT, output
from tests.support import zygote

APP = ROOT / "tests" / "apps" / "pooled_app.py"
PROCESSES, PER_PROCESS, STEPS = 3, 50, 4


def _count(url: str, sql: str, *params: object) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def _log(path: Path) -> list[tuple[int, str, int]]:
    """(pid, workflow id, step) of every step run, as the processes logged them."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(p), w, int(k)) for p, w, k in (line.split() for line in lines)]


@pytest.mark.parametrize("session", ["one-url", "session-url"])
def test_a_fleet_through_pgbouncer_loses_a_process_and_every_workflow_finishes_once(
    session: str,
    pooled_database_url: str,
    dbos_agent_database_url: str,
    tmp_path: Path,
) -> None:
    """3 processes x 50 workflows that step, wait in recv and are woken; one process is
    killed -9 while its workflows wait, and the others take them over. One URL: the
    sessions hold no lock (lease-only, the dead one seen gone from this host) and nothing
    LISTENs; with a session URL, the lock and LISTEN go to the server directly."""
    direct, log = dbos_agent_database_url, tmp_path / "steps.log"
    prefix = f"pooled-{session}-{os.getpid()}"
    env = {
        **os.environ,
        "DBOS_AGENT_DATABASE_URL": pooled_database_url,
        "POOLED_LOG": str(log),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("DBOS_AGENT_SESSION_URL", None)
    if session == "session-url":
        env["DBOS_AGENT_SESSION_URL"] = direct
    ids = [f"{prefix}-{p}-{i:03d}" for p in range(PROCESSES) for i in range(PER_PROCESS)]
    like = f"{prefix}-%"
    procs = [
        zygote.popen(
            [sys.executable, str(APP), f"{prefix}-{p}", str(PER_PROCESS)],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(PROCESSES)
    ]
    victim, survivors = procs[0], procs[1:]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started", output(proc)
        waiting = (
            "SELECT count(DISTINCT workflow_id) FROM dbos_agent.steps"
            " WHERE name = 'dbos_agent.recv' AND workflow_id LIKE %s"
        )
        wait_until(lambda: _count(direct, waiting, like) == len(ids), 120, "all waiting in recv")
        modes = (
            "SELECT count(*) FROM dbos_agent.executors"
            " WHERE executor_id LIKE %s AND lease_only = %s"
        )
        assert _count(direct, modes, "pooled-" + like, session == "one-url") == PROCESSES

        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        orphaned = (
            "SELECT count(*) FROM dbos_agent.workflows AS w"
            " JOIN dbos_agent.executors AS e ON e.session_key = w.owner_key"
            " WHERE w.workflow_id LIKE %s AND e.pid = %s"
        )
        wait_until(lambda: _count(direct, orphaned, like, victim.pid) == 0, 60, "a take-over")
        # the victim's workflows wait in recv again, in the survivors
        wait_until(lambda: sum(1 for pid, _, k in _log(log) if k == 2) == len(ids), 30, "replays")

        with da.Client(pooled_database_url) as client:
            for wid in ids:
                client.send(wid, f"go {wid}", topic="go")
        succeeded = (
            "SELECT count(*) FROM dbos_agent.workflows"
            " WHERE workflow_id LIKE %s AND status = 'SUCCESS'"
        )
        wait_until(lambda: _count(direct, succeeded, like) == len(ids), 120, "all SUCCESS")
    finally:
        errors = [proc.communicate(timeout=60)[1] for proc in procs]  # stdin closed: exit
    for proc, err in zip(survivors, errors[1:], strict=True):
        assert proc.returncode == 0, output(proc, None, err)

    runs = _log(log)
    once = Counter((wid, k) for _, wid, k in runs)
    assert set(once) == {(wid, k) for wid in ids for k in range(STEPS)}
    assert set(once.values()) == {1}, [key for key, n in once.items() if n > 1]
    # the victim's last steps ran in the survivors, after the take-over
    victims = {wid for wid in ids if wid.startswith(f"{prefix}-0-")}
    finishers = {pid for pid, wid, k in runs if wid in victims and k == 3}
    assert finishers and victim.pid not in finishers
    assert finishers <= {proc.pid for proc in survivors}
