"""Approvals bound to the exact tool call: a decision names the workflow, the step and the
digest of the tool and its arguments, and is taken once. Forged (other arguments),
doubled, or for a workflow that no longer waits: refused, in Python, from the CLI and
over HTTP. Replayed after a crash: the recorded decision, nothing asked or run twice."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from anthropic.types import ToolResultBlockParam, ToolUseBlock

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent.agent import ToolRegistry, tool
from dbos_agent.testing import Inspector
from tests.helpers import SimulatedCrash, cli, new_id, per_test, wait_until
from tests.processes import output
from tests.support.web import TOKEN, Server

RUNS: Counter[str] = per_test(Counter())
CRASH: set[str] = per_test(set())


@da.step
def deploy(env: str) -> str:
    RUNS[f"deploy:{env}"] += 1
    return f"deployed to {env}"


@da.durable_workflow(name="approvals_guarded_deploy")
def guarded_deploy(env: str) -> str:
    decision = da.request_approval("deploy", {"env": env})
    if not decision.approved:
        return f"not deployed: {decision.reason}"
    result = deploy(env)
    if "after-deploy" in CRASH:
        CRASH.discard("after-deploy")
        raise SimulatedCrash("died after the deploy")
    return result


def waiting_request(workflow_id: str) -> da.operations.ApprovalRequest:
    def pending() -> list[da.operations.ApprovalRequest]:
        return [a for a in da.operations.list_approvals(workflow_id) if a.status == "PENDING"]

    wait_until(lambda: pending(), 15, "the approval request")
    return pending()[0]


def test_a_decision_is_bound_to_the_call_and_taken_once(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    handle = da.start(guarded_deploy, "prod")
    request = waiting_request(handle.workflow_id)
    assert (request.tool, request.arguments) == ("deploy", {"env": "prod"})
    assert request.digest == da.operations.approval_digest("deploy", {"env": "prod"})
    assert request.seq == 0
    wait_until(lambda: inspector.status(handle.workflow_id) == "SUSPENDED", 15, "suspended")

    forged = da.operations.approval_digest("deploy", {"env": "staging"})
    with pytest.raises(da.errors.ApprovalError, match="other arguments"):
        da.operations.approve(handle.workflow_id, request.seq, forged)
    with pytest.raises(da.errors.ApprovalError, match="no approval request there"):
        da.operations.approve(handle.workflow_id, 5, request.digest)
    with pytest.raises(da.WorkflowNotFoundError):
        da.operations.approve("no-such-workflow", 0, request.digest)

    da.operations.approve(handle.workflow_id, request.seq, request.digest, reason="looks fine")
    assert handle.result(timeout=30) == "deployed to prod"
    with pytest.raises(da.errors.ApprovalError, match="already approved"):
        da.operations.approve(handle.workflow_id, request.seq, request.digest)
    with pytest.raises(da.errors.ApprovalError, match="already approved"):
        da.operations.reject(handle.workflow_id, request.seq, request.digest)
    assert RUNS["deploy:prod"] == 1
    (decided,) = da.operations.list_approvals(handle.workflow_id)
    assert (decided.status, decided.reason) == ("APPROVED", "looks fine")


def test_a_rejection_reaches_the_workflow_with_its_reason(runtime: da.Runtime) -> None:
    handle = da.start(guarded_deploy, "prod")
    request = waiting_request(handle.workflow_id)
    da.operations.reject(handle.workflow_id, request.seq, request.digest, reason="freeze week")
    assert handle.result(timeout=30) == "not deployed: freeze week"
    assert RUNS["deploy:prod"] == 0


def test_a_workflow_that_no_longer_waits_takes_no_decision(runtime: da.Runtime) -> None:
    handle = da.start(guarded_deploy, "prod")
    request = waiting_request(handle.workflow_id)
    da.operations.cancel(handle.workflow_id)
    with pytest.raises(da.errors.ApprovalError, match="CANCELLED, no longer waiting"):
        da.operations.approve(handle.workflow_id, request.seq, request.digest)


def test_a_replayed_approval_is_neither_asked_for_nor_acted_on_twice(
    runtime: da.Runtime, engine: Engine
) -> None:
    wid = new_id("replayed")
    CRASH.add("after-deploy")
    handle = da.start(guarded_deploy, "prod", workflow_id=wid)
    request = waiting_request(wid)
    da.operations.approve(wid, request.seq, request.digest)
    wait_until(lambda: RUNS["deploy:prod"] == 1, 15, "deployed once")
    # the crashed run has ended here (else the call below would wait for the take-back)
    wait_until(lambda: wid not in engine.active_ids(), 15, "the crashed run ended")
    with da.workflow_id(wid):  # the crashed run is continued from its log
        assert guarded_deploy("prod") == "deployed to prod"
    assert RUNS["deploy:prod"] == 1  # the recorded approval and deploy were replayed
    assert len(da.operations.list_approvals(wid)) == 1  # and nothing was asked again
    assert handle.workflow_id == wid


@da.durable_workflow(name="approvals_async_deploy")
async def async_guarded_deploy(env: str) -> str:
    ticket = await da.aio.ask_approval("deploy", {"env": env})
    decision = await da.aio.wait_for_approval(ticket)
    return f"{env}: {decision.approved} ({decision.reason}) at step {ticket.seq}"


def test_async_workflows_ask_and_wait_for_approval(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    handle = da.start(async_guarded_deploy, "prod")
    request = waiting_request(handle.workflow_id)
    assert request.digest == da.operations.approval_digest("deploy", {"env": "prod"})
    wait_until(lambda: inspector.status(handle.workflow_id) == "SUSPENDED", 15, "suspended")
    da.operations.approve(handle.workflow_id, request.seq, request.digest, reason="fine")
    assert handle.result(timeout=30) == "prod: True (fine) at step 0"
    # the same steps as the sync forms record: a run may switch between them
    assert [s.name for s in handle.steps()] == ["dbos_agent.request_approval", "dbos_agent.recv"]


@tool(requires_approval=True)
def delete_branch(name: str) -> str:
    """Delete a git branch."""
    RUNS[f"delete:{name}"] += 1
    return f"deleted {name}"


TOOLS = ToolRegistry([delete_branch])


@da.durable_workflow(name="approvals_agent_turn")
def agent_turn(names: list[str]) -> list[ToolResultBlockParam]:
    blocks = [
        ToolUseBlock(type="tool_use", id=f"toolu_{i}", name="delete_branch", input={"name": n})
        for i, n in enumerate(names)
    ]
    return TOOLS.call_all(blocks, parallel=True)


def test_a_tool_that_requires_approval_runs_only_once_approved(runtime: da.Runtime) -> None:
    handle = da.start(agent_turn, ["old", "main"])
    first = waiting_request(handle.workflow_id)
    assert first.arguments == {"name": "old"}
    da.operations.approve(handle.workflow_id, first.seq, first.digest)
    wait_until(
        lambda: any(
            a.arguments == {"name": "main"} and a.status == "PENDING"
            for a in da.operations.list_approvals(handle.workflow_id)
        ),
        15,
        "the second request",
    )
    second = next(
        a for a in da.operations.list_approvals(handle.workflow_id) if a.status == "PENDING"
    )
    da.operations.reject(handle.workflow_id, second.seq, second.digest, reason="never main")
    results = handle.result(timeout=30)
    assert results[0]["content"] == "deleted old"
    assert results[1].get("is_error") and "never main" in str(results[1]["content"])
    assert RUNS == Counter({"delete:old": 1})


def test_decisions_from_the_cli_and_over_http(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    url = dbos_agent_database_url
    cli_handle = da.start(guarded_deploy, "cli")
    request = waiting_request(cli_handle.workflow_id)
    listed = cli(url, "approvals", cli_handle.workflow_id)
    assert listed.returncode == 0 and request.digest in listed.stdout
    forged = cli(url, "approve", cli_handle.workflow_id, "0", "--digest", "0" * 64)
    assert forged.returncode == 1 and "other arguments" in forged.stderr
    approved = cli(url, "approve", cli_handle.workflow_id, "0", "--digest", request.digest)
    assert approved.returncode == 0, output(approved)
    assert cli_handle.result(timeout=30) == "deployed to cli"
    doubled = cli(url, "reject", cli_handle.workflow_id, "0", "--digest", request.digest)
    assert doubled.returncode == 1 and "already approved" in doubled.stderr

    http_handle = da.start(guarded_deploy, "http")
    request = waiting_request(http_handle.workflow_id)
    with (
        Server(url, TOKEN) as server,
        httpx.Client(
            base_url=server.base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as api,
    ):
        path = f"/api/workflows/{http_handle.workflow_id}/approvals"
        assert api.get(path).json()[0]["digest"] == request.digest
        assert any(
            a["workflow_id"] == http_handle.workflow_id for a in api.get("/api/approvals").json()
        )
        forged_http = api.post(f"{path}/0", json={"approve": True, "digest": "f" * 64})
        assert forged_http.status_code == 409 and "other arguments" in forged_http.json()["error"]
        ok = api.post(f"{path}/0", json={"approve": True, "digest": request.digest})
        assert ok.status_code == 200
        assert http_handle.result(timeout=30) == "deployed to http"
        doubled_http = api.post(f"{path}/0", json={"approve": True, "digest": request.digest})
        assert doubled_http.status_code == 409
        missing = api.post("/api/workflows/nope/approvals/0", json={"approve": True, "digest": "x"})
        assert missing.status_code == 404
