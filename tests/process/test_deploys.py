"""Workflows outlive deploys: an agent waiting for an approval meets new code.

tests/apps/deploy/v1.py, v2.py and v3.py are three successive versions of one application,
run as real processes on one database.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import cli, new_id, ok, wait_until
from tests.processes import ROOT, output, start_worker, stop_workers
from tests.support import zygote


def _start(url: str, version: str, workflow_id: str, log: Path, app_version: str = "") -> None:
    """Start deploy_flow with version ``version``'s code (under application version
    ``app_version``, if any); returns once it waits."""
    done = zygote.run(
        [sys.executable, "-m", f"tests.apps.deploy.{version}", "start", workflow_id],
        env={
            **os.environ,
            "DBOS_AGENT_DATABASE_URL": url,
            "PYTHONPATH": str(ROOT),
            "DEPLOY_LOG": str(log),
            "DEPLOY_APP_VERSION": app_version,
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, output(done)


def _snapshot(url: str, workflow_id: str) -> tuple[object, ...]:
    """Everything the database holds of one workflow."""
    with Inspector(url) as db:
        return db.workflow(workflow_id), db.steps(workflow_id), db.messages(workflow_id)


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

    # before deploying v2, the check says it does not fit, and names the workflow
    before = _snapshot(url, wid)
    checked = cli(url, "check-deploy", "--app", "tests.apps.deploy.v2", cwd=ROOT)
    assert checked.returncode == 1, output(checked)
    assert (
        f"{wid}  SUSPENDED  at step 0 the log recorded 'prepare', the new code calls 'audit'"
        in (checked.stdout)
    )
    report = json.loads(cli(url, "check-deploy", "--app", "tests.apps.deploy.v2", "--json",
                            cwd=ROOT).stdout)  # fmt: skip
    assert report["fits"] is False
    assert {
        "workflow_id": wid,
        "position": 0,
        "recorded": "prepare",
        "called": "audit",
    }.items() <= (next(m for m in report["misfits"] if m["workflow_id"] == wid).items())
    assert ok(cli(url, "check-deploy", "--app", "tests.apps.deploy.v3", cwd=ROOT)).endswith(
        "every workflow fits: the new code continues each from its log\n"
    )
    assert _snapshot(url, wid) == before, "a check writes nothing"
    assert _runs(log, wid) == Counter({"v1 prepare": 1}), "and runs nothing"

    # v2 adds a step before prepare, without a patch, and is deployed anyway
    v2 = start_worker(url, "tests.apps.deploy.v2", env=env)
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
    v3 = start_worker(url, "tests.apps.deploy.v3", env=env)
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


def test_adopt_lets_the_new_application_version_wake_what_the_old_one_left(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    """Processes of app version 2 run only version 2's workflows: a version 1 workflow
    waiting when the last version 1 process is retired would wait for ever. Checked to
    fit and adopted, it is woken by version 2 when its message comes."""
    url, log = dbos_agent_database_url, tmp_path / "deploy.log"
    wid = new_id("versions")
    _start(url, "v1", wid, log, app_version="1")
    v2 = start_worker(
        url, "tests.apps.deploy.v3", "--app-version", "2", env={"DEPLOY_LOG": str(log)}
    )
    try:
        adopted = ok(cli(url, "check-deploy", "--app", "tests.apps.deploy.v3", "--app-version", "2",
                         "--adopt", cwd=ROOT))  # fmt: skip
        assert "adopted 1 workflow(s) of other versions for version 2" in adopted
        with Inspector(url) as db:
            info = db.workflow(wid)
            assert info is not None and info.app_version == "1"
        with da.Client(url) as client:
            client.send(wid, "later", topic="approve")
            assert client.retrieve(wid).result(timeout=30)[-1] == "applied after later"
    finally:
        stop_workers([v2])
    assert _runs(log, wid) == Counter({"v1 prepare": 1, "v3 apply": 1})
