"""Human in the loop: the coding agent waits, across a kill -9, for approval sent by the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import dbos_agent as da
from dbos_agent.agent.scripted_server import CHANGELOG_LINE
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until
from tests.processes import output
from tests.support import zygote
from tests.support.web import CHROMIUM, TOKEN, Server, dashboard

pytestmark = pytest.mark.long  # many processes, a minute or more: started first

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "coding_agent.py"


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env.update(DBOS_AGENT_DATABASE_URL=url, PYTHONPATH=str(ROOT))
    return env


def _agent(url: str, task: str, workdir: Path) -> subprocess.Popen[str]:
    return zygote.popen(
        [
            sys.executable,
            str(EXAMPLE),
            "--require-approval",
            "--task-id",
            task,
            "--workdir",
            str(workdir),
        ],
        env=_env(url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _waiting_for_approval(db: Inspector, task: str) -> bool:
    try:
        return db.event(task, "awaiting_approval", None) is not None
    except psycopg.errors.UndefinedTable:  # the agent has not created the schema yet
        return False


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        [sys.executable, "-m", "dbos_agent", *args],
        env=_env(url),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("approved", [True, False])
def test_the_agent_waits_for_a_human_across_a_crash(
    dbos_agent_database_url: str, inspector: Inspector, tmp_path: Path, approved: bool
) -> None:
    url, task, workdir = dbos_agent_database_url, new_id("approval"), tmp_path / "work"
    db = inspector
    first = _agent(url, task, workdir)
    try:
        wait_until(lambda: _waiting_for_approval(db, task), 60, "the agent to wait for approval")
        first.send_signal(signal.SIGKILL)  # killed while it waits for the human
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    assert (
        not (workdir / "CHANGELOG.md").exists()
        or CHANGELOG_LINE not in (workdir / "CHANGELOG.md").read_text()
    )

    second = _agent(url, task, workdir)
    try:
        wait_until(lambda: db.owner_pid(task) == second.pid, 60, "the second run took over")
        listed = _cli(url, "--json", "approvals", task)
        assert listed.returncode == 0, output(listed)
        (request,) = json.loads(listed.stdout)
        assert request["tool"] == "run_bash" and request["status"] == "PENDING"
        forged = _cli(url, "approve", task, str(request["seq"]), "--digest", "0" * 64)
        assert forged.returncode == 1 and "other arguments" in forged.stderr
        verb, extra = ("approve", []) if approved else ("reject", ["--reason", "no"])
        decided = _cli(url, verb, task, str(request["seq"]), "--digest", request["digest"], *extra)
        assert decided.returncode == 0, output(decided)
        out, _ = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 0, output(second, out, None)
    assert "waiting for approval" in out  # the resumed run asks again: it is still waiting
    assert ("✓ approved" if approved else "✗ rejected: no") in out  # and says what it got
    path = workdir / "CHANGELOG.md"
    changelog = path.read_text() if path.exists() else ""
    assert changelog.count(CHANGELOG_LINE) == (1 if approved else 0)
    names = db.step_names(task)
    assert db.status(task) == da.WorkflowStatus.SUCCESS
    assert names.count("dbos_agent.recv") == 1  # the decision was taken once
    assert names.count("dbos_agent.request_approval") == 1  # and asked for once
    # the tests ran twice; the append ran only when approved
    assert names.count("tool:run_bash") == (3 if approved else 2)


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("DBOS_AGENT_REQUIRE_BROWSER"),
    reason="needs Debian's chromium (.ci/run installs it)",
)
def test_the_agent_is_approved_from_the_dashboard(
    dbos_agent_database_url: str, inspector: Inspector, tmp_path: Path
) -> None:
    """The same wait, decided with the Approve button of the web page: the commands the
    agent asks about are shown, and the approved one runs once."""
    from playwright.sync_api import expect, sync_playwright

    url, task, workdir = dbos_agent_database_url, new_id("web-approval"), tmp_path / "work"
    agent = _agent(url, task, workdir)
    try:
        wait_until(lambda: _waiting_for_approval(inspector, task), 60, "the agent to wait")
        with da.Client(url) as client:
            wait_until(lambda: client.approvals(task), 30, "the approval request")
        with Server(url, TOKEN) as server, sync_playwright() as pw, dashboard(pw, server) as page:
            page.locator(f'tr[data-id="{task}"]').click()
            expect(page.get_by_test_id("approvals")).to_contain_text("run_bash", timeout=15_000)
            expect(page.get_by_test_id("approvals")).to_contain_text("CHANGELOG")
            page.locator('[data-testid^="approve-"]').first.click()
            out, _ = agent.communicate(timeout=60)
            page.screenshot(path=str(tmp_path / "agent-approved.png"))
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, output(agent, out, None)
    assert "✓ approved" in out
    assert (workdir / "CHANGELOG.md").read_text().count(CHANGELOG_LINE) == 1
    assert (tmp_path / "agent-approved.png").read_bytes().startswith(b"\x89PNG")
    with da.Client(url) as client:
        (decided,) = client.approvals(task)
    assert decided.status == "APPROVED"
