"""Failover in every process: plain application processes (no worker daemon) take over
the workflows of one that was killed -9, whatever their executor ids, and no workflow is
ever run by two of them at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import dbos_agent as da
from dbos_agent.testing import Inspector, RestartablePostgres
from tests.helpers import new_id, wait_until
from tests.processes import assert_never_two_at_once, kill9
from tests.processes import executions as _executions
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]

#: The target: the survivor continues the victim's workflows within this many seconds.
CONTINUES_WITHIN_S = 5.0


def _app(url: str, log: Path, prefix: str, executor: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DBOS_AGENT_DATABASE_URL": url,
        "PYTHONPATH": str(ROOT),
        "WORKER_APP_LOG": str(log),
        "WORKER_APP_STEP_SECONDS": "0.05",
        "FLEET_EXECUTOR": executor,
    }
    return zygote.popen(
        [sys.executable, "-m", "tests.apps.fleet_app", prefix, "6", "20"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("executors", [("local", "local"), ("app-a", "app-b")])
def test_two_app_processes_one_killed_the_survivor_continues_its_workflows(
    dbos_agent_database_url: str, tmp_path: Path, executors: tuple[str, str]
) -> None:
    url, log = dbos_agent_database_url, tmp_path / "steps.log"
    log.touch()
    victim_prefix, survivor_prefix = new_id("victim"), new_id("survivor")
    victim = _app(url, log, victim_prefix, executors[0])
    survivor = _app(url, log, survivor_prefix, executors[1])
    ids = [f"{p}-{i}" for p in (victim_prefix, survivor_prefix) for i in range(6)]
    victims = ids[:6]
    try:
        for proc in (victim, survivor):
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started"
        wait_until(
            lambda: {wid for pid, wid, *_ in _executions(log) if pid == victim.pid} >= set(victims),
            30,
            "every victim workflow to have run a step",
            every=0.02,
        )
        killed_at = kill9(victim)
        with Inspector(url) as db:
            wait_until(lambda: db.all_finished(ids), 60, "every workflow to finish")
            assert set(db.statuses(ids).values()) == {da.WorkflowStatus.SUCCESS}
            assert all(db.workflow(wid).output == sum(range(20)) for wid in ids)  # type: ignore[union-attr]
    finally:
        for proc in (victim, survivor):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    rows = _executions(log)
    # the survivor continued each victim workflow soon after the kill ...
    continued = {
        wid: min(start for pid, w, _, start, _ in rows if w == wid and pid == survivor.pid)
        for wid in victims
    }
    late = {wid: round(at - killed_at, 2) for wid, at in continued.items()}
    assert max(late.values()) < CONTINUES_WITHIN_S, late
    # ... and never while the victim ran it
    assert assert_never_two_at_once(rows, victim.pid, killed_at) == len(victims)
    # each step ran once, but for the one in flight at the kill
    runs: dict[tuple[str, int], int] = defaultdict(int)
    for _pid, wid, seq, *_ in rows:
        runs[(wid, seq)] += 1
    assert all(count == 1 for (wid, _), count in runs.items() if wid not in victims)
    assert all(count <= 2 for count in runs.values())


def test_an_app_process_killed_while_postgres_restarts_is_still_taken_over(
    dbos_agent_restartable_postgres: RestartablePostgres, tmp_path: Path
) -> None:
    """The survivor's take-over rides out the restart (its look fails, it looks again) and
    continues the dead process's workflows, none in two processes at once."""
    server, log = dbos_agent_restartable_postgres, tmp_path / "steps.log"
    log.touch()
    with server.database() as url:
        victim_prefix, survivor_prefix = new_id("victim"), new_id("survivor")
        victim = _app(url, log, victim_prefix, "app-a")
        survivor = _app(url, log, survivor_prefix, "app-b")
        ids = [f"{p}-{i}" for p in (victim_prefix, survivor_prefix) for i in range(6)]
        try:
            for proc in (victim, survivor):
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "started"
            wait_until(
                lambda: (
                    {wid for pid, wid, *_ in _executions(log) if pid == victim.pid} >= set(ids[:6])
                ),
                30,
                "every victim workflow under way",
                every=0.02,
            )
            killed_at = kill9(victim)
            server.restart()
            with Inspector(url) as db:
                wait_until(lambda: db.all_finished(ids), 90, "every workflow to finish")
                assert set(db.statuses(ids).values()) == {da.WorkflowStatus.SUCCESS}
        finally:
            for proc in (victim, survivor):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=30)
    rows = _executions(log)
    assert assert_never_two_at_once(rows, victim.pid, killed_at) == 6
    runs = Counter((wid, seq) for _, wid, seq, *_ in rows)
    assert max(runs.values()) <= 2, "only a step in flight at the kill ran again"
