"""Budgets counted from the step log: a recovery, a fork or a child workflow cannot reset
them; a call the budget cannot cover is refused with a recorded BudgetExceededError."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

import dbos_agent as da
from dbos_agent.agent import Budget, Model
from dbos_agent.agent.budget import raise_budget
from dbos_agent.agent.scripted_server import Delay, Reply, ScriptedServer, ScriptItem, text
from dbos_agent.testing import Inspector
from tests.helpers import SimulatedCrash, cli, new_id, wait_until
from tests.processes import output
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]
MODELS: dict[str, Model] = {}
CRASH: Counter[str] = Counter()
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    # every reply costs 300 tokens (200 in, 100 out); a call may use up to 200 more
    with ScriptedServer(lambda body: Reply((text("ok"),), usage=(200, 100))) as running:
        MODELS["model"] = Model(
            anthropic.Anthropic(base_url=running.url, api_key="x"),
            model="claude-haiku-4-5",
            max_tokens=200,
            retries=0,
            budget=Budget(max_tokens=1000),
        )
        yield running
    MODELS.clear()
    CRASH.clear()


@da.durable_workflow(name="budgets_calls")
def calls(n: int) -> int:
    made = 0
    for _ in range(n):
        MODELS["model"].create(HI)  # type: ignore[arg-type]
        made += 1
        if CRASH["after"] == made:
            CRASH["after"] = 0
            raise SimulatedCrash("died mid-way")
    return made


@da.durable_workflow(name="budgets_parent")
def parent(n: int) -> int:
    MODELS["model"].create(HI)  # type: ignore[arg-type]
    MODELS["model"].create(HI)  # type: ignore[arg-type]
    return da.start(calls, n, workflow_id=f"{da.current_workflow_id()}-child").result()


def test_a_call_past_the_budget_is_refused_and_recorded(
    runtime: da.Runtime, server: ScriptedServer, inspector: Inspector
) -> None:
    wid = new_id("budget")
    refused_at = "spent 900 of its 1,000-token budget"
    with pytest.raises(da.errors.BudgetExceededError, match=refused_at), da.workflow_id(wid):
        calls(5)
    assert len(server.requests) == 3  # 0, 300, 600 spent: each fits; 900 + 200 does not
    assert inspector.status(wid) == "ERROR"
    refused = inspector.steps(wid)[-1]
    assert refused.status == "ERROR" and "BudgetExceededError" in str(refused.error)
    with pytest.raises(da.errors.BudgetExceededError), da.workflow_id(wid):
        calls(5)  # the recorded outcome: nothing is called again
    assert len(server.requests) == 3


def test_neither_a_recovery_nor_a_fork_resets_the_budget(
    runtime: da.Runtime, server: ScriptedServer
) -> None:
    wid = new_id("budget-crash")
    CRASH["after"] = 2
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        calls(5)
    with pytest.raises(da.errors.BudgetExceededError), da.workflow_id(wid):
        calls(5)  # continued from its log: the two recorded calls count
    assert len(server.requests) == 3
    steps = [s.name for s in da.operations.list_steps(wid)]
    forked = da.operations.fork(wid, from_step=steps.index("anthropic.messages", 3) + 1)
    with pytest.raises(da.errors.BudgetExceededError):
        forked.result(timeout=30)  # the fork copied the three calls, and their spend
    assert len(server.requests) == 3


def test_a_child_workflow_counts_against_its_parents_budget(
    runtime: da.Runtime, server: ScriptedServer
) -> None:
    wid = new_id("budget-parent")
    with pytest.raises(da.errors.BudgetExceededError), da.workflow_id(wid):
        parent(5)
    assert len(server.requests) == 3  # two by the parent, one by the child, then refused
    with pytest.raises(da.errors.BudgetExceededError):
        da.retrieve(f"{wid}-child").result(timeout=30)


def test_the_spend_against_the_budget_is_shown(
    runtime: da.Runtime, server: ScriptedServer, dbos_agent_database_url: str
) -> None:
    wid = new_id("budget-shown")
    with da.workflow_id(wid):
        assert calls(2) == 2
    shown = cli(dbos_agent_database_url, "--json", "workflows", "show", wid)
    assert shown.returncode == 0, output(shown)
    budget = json.loads(shown.stdout)["budget"]
    assert budget["max_tokens"] == 1000 and budget["spent_tokens"] == 600
    human = cli(dbos_agent_database_url, "workflows", "show", wid)
    assert "600 of 1,000 tokens" in human.stdout


def test_a_bad_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        Budget(max_tokens=0)
    with pytest.raises(ValueError, match="max_cost_usd must be > 0"):
        Budget(max_cost_usd=float("nan"))


@da.durable_workflow(name="budgets_patient")
def patient(n: int) -> int:
    for _ in range(n):
        MODELS["patient"].create(HI)  # type: ignore[arg-type]
    return n


def test_a_workflow_can_wait_for_a_raised_budget(
    runtime: da.Runtime, server: ScriptedServer, inspector: Inspector
) -> None:
    MODELS["patient"] = Model(
        anthropic.Anthropic(base_url=server.url, api_key="x"),
        model="claude-haiku-4-5",
        max_tokens=200,
        retries=0,
        budget=Budget(max_tokens=1000, wait_for_raise=True),
    )
    handle = da.start(patient, 5)
    wait_until(
        lambda: inspector.status(handle.workflow_id) == "SUSPENDED", 30, "waiting for a raise"
    )
    assert len(server.requests) == 3
    raise_budget(handle.workflow_id, max_tokens=2000)
    assert handle.result(timeout=30) == 5
    assert len(server.requests) == 5  # the refused call ran once the budget was raised
    assert da.get_event(handle.workflow_id, "dbos_agent.budget")["max_tokens"] == 2000


def test_a_budget_holds_across_a_kill_of_the_process(dbos_agent_database_url: str) -> None:
    """Killed -9 during its third call, the workflow is recovered by a new process: the
    two recorded calls still count (600 tokens), the third is made again (it was in
    flight, so it is paid twice) and the fourth is refused, as without the kill."""
    url, wid = dbos_agent_database_url, new_id("budget-kill")
    script: list[ScriptItem] = [
        Reply((text("1"),), usage=(200, 100)),
        Reply((text("2"),), usage=(200, 100)),
        Delay(5, Reply((text("never"),), usage=(200, 100))),  # the process dies here
        Reply((text("3"),), usage=(200, 100)),
    ]
    with ScriptedServer(script) as model:
        env = {
            **os.environ,
            "DBOS_AGENT_DATABASE_URL": url,
            "MODEL_URL": model.url,
            "PYTHONPATH": str(ROOT),
        }
        app = [sys.executable, "-m", "tests.apps.budget_app", wid, "5"]
        first = zygote.popen(app, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE)
        try:  # killed while the third reply is delayed (not once it is answered: by then
            # the run may have recorded it, and a fast one does)
            wait_until(lambda: model.next_index >= 3, 60, "the third call under way")
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate(timeout=30)
        second = zygote.run(app, env=env, cwd=ROOT, text=True, capture_output=True, timeout=120)
        assert second.returncode == 0, output(second)
        outcome = json.loads(second.stdout.strip().splitlines()[-1])
        assert outcome["error"] == "BudgetExceededError", outcome
        assert "spent 900 of its 1,000-token budget" in outcome["message"]
        # the killed 3rd call is logged when its delayed answer finds the client gone
        model.wait_for_requests(4, timeout=30)
        assert len(model.requests) == 4  # 1, 2, the killed 3rd, its re-run; never a 5th
