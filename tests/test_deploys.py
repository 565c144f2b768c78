"""Workflows outlive deploys: an agent waiting for an approval meets new code.

tests/deploy/v1.py, v2.py and v3.py are three successive versions of one application,
run as real processes on one database.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until
from tests.processes import ROOT, start_worker, stop_workers


def _start(url: str, version: str, workflow_id: str, log: Path) -> None:
    """Start deploy_flow with version ``version``'s code; returns once it waits."""
    done = subprocess.run(
        [sys.executable, "-m", f"tests.deploy.{version}", "start", workflow_id],
        env={
            **os.environ,
            "DBOS_AGENT_DATABASE_URL": url,
            "PYTHONPATH": str(ROOT),
            "DEPLOY_LOG": str(log),
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def _runs(log: Path, workflow_id: str) -> Counter[str]:
    """``{"version step": count}`` of the live step runs of one workflow."""
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(
        f"{version} {step}"
        for version, step, wid in (line.split() for line in lines)
        if wid == workflow_id
    )


def test_a_waiting_agent_outlives_a_deploy_that_does_not_fit_its_log(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, log = dbos_agent_database_url, tmp_path / "deploy.log"
    env = {"DEPLOY_LOG": str(log)}
    wid = new_id("deploy")
    _start(url, "v1", wid, log)  # v1 prepares, then waits for the approval, suspended
    assert _runs(log, wid) == Counter({"v1 prepare": 1})

    # v2 adds a step before prepare, without a patch, and is deployed anyway
    v2 = start_worker(url, "tests.deploy.v2", env=env)
    try:
        with da.Client(url) as client, Inspector(url) as db:
            client.send(wid, "yes", topic="approve")  # v2 wakes it and replays its log
            wait_until(lambda: db.status(wid) == da.WorkflowStatus.DIVERGED, 30, "held")
            info = db.workflow(wid)
            assert info is not None and info.error is None, "held, never ERROR"
            assert info.diverged is not None
            assert (info.diverged.position, info.diverged.recorded, info.diverged.called) == (
                0,
                "prepare",
                "audit",
            )
    finally:
        v2_log = stop_workers([v2])
    assert "is held as DIVERGED" in v2_log
    assert _runs(log, wid) == Counter({"v1 prepare": 1}), "v2 ran nothing of it"

    # v3 makes the change with da.patched: it takes the held workflow up and finishes it
    v3 = start_worker(url, "tests.deploy.v3", env=env)
    try:
        with da.Client(url) as client:
            result = client.retrieve(wid).result(timeout=30)
            assert result == ["prepared", "yes", "applied after yes"]
            assert _runs(log, wid) == Counter({"v1 prepare": 1, "v3 apply": 1})

            # and a fresh run of v3 takes the new branch
            fresh = new_id("deploy")
            _start(url, "v3", fresh, log)
            client.send(fresh, "ok", topic="approve")
            assert client.retrieve(fresh).result(timeout=30) == [
                "audited", "prepared", "ok", "applied after ok"
            ]  # fmt: skip
            steps = [s.name for s in client.retrieve(fresh).steps()]
            assert steps == ["dbos_agent.patch:audit-first", "audit", "prepare",
                             "dbos_agent.recv", "apply"]  # fmt: skip
    finally:
        stop_workers([v3])
    assert _runs(log, fresh) == Counter({"v3 audit": 1, "v3 prepare": 1, "v3 apply": 1})
