"""Pydantic AI's deferred-tool approvals decided as dbos_agent approvals.

The agent (tests/apps/pydantic_ai_approval_app.py) has ``delete``, registered with
``requires_approval=True``, and ``transfer``, which raises ``ApprovalRequired`` above a
limit. Inside a workflow, ``Durability`` asks for each such call (bound to the digest of the
tool and its arguments) and waits durably for the decision, which the CLI, the HTTP API or
the dashboard gives. The crash campaign runs the app as a subprocess, kills it with
SIGKILL while its workflows wait (suspended), decides with ``dbos-agent approve/reject``
once a fresh process has launched, and counts from outside: the side-effect file, the scripted
server's request log, the step log and the approval requests.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai.agent import AgentRunResult
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

import dbos_agent as da
from dbos_agent.agent.accounting import totals_from_steps
from dbos_agent.agent.scripted.request_log import RequestRecord
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, ScriptItem, text, tool_use
from dbos_agent.integrations.pydantic_ai import DEFAULT_EVENTS_KEY
from dbos_agent.records import StepInfo
from dbos_agent.testing import Inspector
from tests.apps import pydantic_ai_app as app
from tests.apps import pydantic_ai_approval_app as guarded_app
from tests.helpers import cli, new_id, ok, refused, wait_until
from tests.process.test_pydantic_ai import lines, paid, pids_of, task_of, turn_of
from tests.processes import output, start_module
from tests.support.web import TOKEN, Server

pytestmark = pytest.mark.long  # many processes, a minute or more: started first

ROOT = Path(__file__).resolve().parents[2]
MODEL = "guard__model.request"
DELETE = "guard__function_toolset__ops.call_tool:delete"
TRANSFER = "guard__function_toolset__ops.call_tool:transfer"
ASK = "dbos_agent.request_approval"
WAIT = "dbos_agent.recv"

#: The model's turns per task (the conversation's first user message).
SCRIPTS: dict[str, list[ScriptItem]] = {
    # requires_approval=True; approved from the CLI after a kill -9
    "approve": [Reply((tool_use("delete", {"path": "notes.txt"}),)), Reply((text("deleted"),))],
    # raises ApprovalRequired; approved from the CLI after a kill -9
    "ask": [Reply((tool_use("transfer", {"amount": 500}),)), Reply((text("moved"),))],
    # rejected from the CLI after a kill -9
    "reject": [Reply((tool_use("delete", {"path": "thesis.tex"}),)), Reply((text("kept"),))],
    # two calls in one reply, decided over HTTP (in this process)
    "both": [
        Reply(
            (
                tool_use("delete", {"path": "draft.txt"}),
                tool_use("transfer", {"amount": 900}),
                tool_use("transfer", {"amount": 20}),
            )
        ),
        Reply((text("both decided"),)),
    ],
    # in a sync workflow (run_sync), decided with da.operations.reject
    "sync": [Reply((tool_use("delete", {"path": "sync.txt"}),)), Reply((text("not deleted"),))],
    # with the run's events in a stream, approved with da.operations.approve
    "events": [Reply((tool_use("transfer", {"amount": 700}),)), Reply((text("moved 700"),))],
    # approvals=False: Pydantic AI's own flow, in a workflow
    "own": [Reply((tool_use("delete", {"path": "own.txt"}),)), Reply((text("deleted own"),))],
    # outside a workflow
    "plain": [Reply((tool_use("delete", {"path": "plain.txt"}),)), Reply((text("never"),))],
}
CRASHED = ("approve", "ask", "reject")


def answer(body: dict[str, Any]) -> ScriptItem:
    script = SCRIPTS[task_of(body)]
    return script[min(turn_of(body), len(script) - 1)]


@pytest.fixture(scope="module")
def model_server() -> Iterator[ScriptedServer]:
    """One scripted server for the module, answering each task from its script."""
    with ScriptedServer(answer) as server:
        previous = app.use_server(server.url)
        try:
            yield server
        finally:
            app.use_server(previous)


@pytest.fixture
def side_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The side-effect log of the app's tools run in this process."""
    log = tmp_path / "side.log"
    monkeypatch.setenv("SIDE_LOG", str(log))
    return log


@pytest.fixture(scope="module")
def client(dbos_agent_database_url: str) -> Iterator[da.Client]:
    with da.Client(dbos_agent_database_url) as opened:
        yield opened


def tool_results(requests: list[RequestRecord], task: str) -> list[dict[str, Any]]:
    """The tool results the model was sent in ``task``'s second (and last) request."""
    (last,) = [r for r in requests if r.paid and task_of(r.body) == task and turn_of(r.body)]
    return list(last.body["messages"][-1]["content"])


# ------------------------------------------------------------- kill -9 and decide


@dataclass
class Campaign:
    """What the crash campaign left: who ran, what was asked, what the CLI said."""

    ids: dict[str, str]
    killed: int
    resumed: int
    results: dict[str, Any]
    at_kill: dict[str, list[StepInfo]]
    asked: dict[str, list[dict[str, Any]]]  # `dbos-agent --json approvals ID` at the kill
    forged: subprocess.CompletedProcess[str]
    again: subprocess.CompletedProcess[str]
    requests: list[RequestRecord]
    side_log: Path


def start_app(url: str, ids: dict[str, str], env: dict[str, str]) -> subprocess.Popen[str]:
    calls = [f"{wid}={task}" for task, wid in ids.items()]
    return start_module(url, "tests.apps.pydantic_ai_approval_app", *calls, env=env)


@pytest.fixture(scope="module")
def campaign(
    dbos_agent_database_url: str,
    dbos_agent_inspector: Inspector,
    client: da.Client,  # the schema, before the first process asks the log
    model_server: ScriptedServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Campaign:
    url, inspector = dbos_agent_database_url, dbos_agent_inspector
    side_log = tmp_path_factory.mktemp("pydantic-ai-approvals") / "side.log"
    ids = {task: new_id(f"pai-{task}") for task in CRASHED}
    env = {"MODEL_URL": model_server.url, "SIDE_LOG": str(side_log)}

    first = start_app(url, ids, env)
    try:
        wait_until(
            lambda: (
                first.poll() is not None
                or all(inspector.status(w) == da.WorkflowStatus.SUSPENDED for w in ids.values())
            ),
            50,
            "every workflow suspended, waiting for its decision",
        )
        assert first.poll() is None, first.communicate()[1]
    finally:
        first.kill()  # SIGKILL
        first.communicate()
    at_kill = {task: inspector.steps(wid) for task, wid in ids.items()}
    asked = {
        task: json.loads(ok(cli(url, "--json", "approvals", wid))) for task, wid in ids.items()
    }

    second = start_app(url, ids, env)
    try:
        wait_until(
            lambda: second.poll() is not None or second.pid in pids_of(side_log, "started"),
            50,
            "the fresh process launched",
        )
        (request,) = asked["approve"]
        seq, digest = str(request["seq"]), request["digest"]
        forged = cli(url, "approve", ids["approve"], seq, "--digest", "0" * 64)
        ok(cli(url, "approve", ids["approve"], seq, "--digest", digest))
        again = cli(url, "approve", ids["approve"], seq, "--digest", digest)
        (request,) = asked["ask"]
        ok(cli(url, "approve", ids["ask"], str(request["seq"]), "--digest", request["digest"]))
        (request,) = asked["reject"]
        reject = ("reject", ids["reject"], str(request["seq"]), "--digest", request["digest"])
        ok(cli(url, *reject, "--reason", "keep the thesis"))
        out, err = second.communicate(timeout=90)
    finally:
        if second.poll() is None:
            second.kill()
            second.communicate()
    assert second.returncode == 0, output(second, out, err)
    return Campaign(
        ids=ids,
        killed=first.pid,
        resumed=second.pid,
        results=json.loads(out.strip().splitlines()[-1]),
        at_kill=at_kill,
        asked=asked,
        forged=forged,
        again=again,
        requests=model_server.requests,
        side_log=side_log,
    )


def test_an_approval_pending_across_kill_9_approved_by_the_cli_runs_the_tool_once(
    campaign: Campaign, inspector: Inspector, client: da.Client
) -> None:
    wid = campaign.ids["approve"]
    assert [s.name for s in campaign.at_kill["approve"]] == [MODEL, ASK, WAIT]
    (request,) = campaign.asked["approve"]
    assert (request["tool"], request["arguments"], request["status"]) == (
        "delete",
        {"path": "notes.txt"},
        "PENDING",
    )
    assert request["digest"] == da.operations.approval_digest("delete", {"path": "notes.txt"})
    assert campaign.results[wid] == "deleted"
    # the body ran in both processes; the tool only in the one that got the decision, once
    assert pids_of(campaign.side_log, "approve body start") == [campaign.killed, campaign.resumed]
    assert pids_of(campaign.side_log, "delete notes.txt") == [campaign.resumed]
    # asked once, decided once, the tool a step after them
    assert [s.name for s in inspector.steps(wid)] == [MODEL, ASK, WAIT, DELETE, MODEL]
    (decided,) = client.approvals(wid)
    assert (decided.seq, decided.status) == (request["seq"], "APPROVED")
    conversations = paid(campaign.requests, "approve")
    assert len(conversations) == 2 and len(set(conversations)) == 2  # each request once
    assert tool_results(campaign.requests, "approve")[0]["content"][0]["text"] == (
        "deleted notes.txt"
    )


def test_a_forged_digest_and_a_second_decision_are_refused(campaign: Campaign) -> None:
    refused(campaign.forged, 1, "for other arguments than the ones asked about")
    refused(campaign.again, 1, "the request was already approved")


def test_a_rejected_call_reaches_the_model_as_denied_with_the_reason_and_never_runs(
    campaign: Campaign, inspector: Inspector, client: da.Client
) -> None:
    wid = campaign.ids["reject"]
    assert campaign.results[wid] == "kept"
    assert "delete thesis.tex" not in lines(campaign.side_log)
    (result,) = tool_results(campaign.requests, "reject")
    assert result["content"][0]["text"] == "A human rejected this call: keep the thesis"
    assert [s.name for s in inspector.steps(wid)] == [MODEL, ASK, WAIT, MODEL]
    (decided,) = client.approvals(wid)
    assert (decided.status, decided.reason) == ("REJECTED", "keep the thesis")


def test_a_tool_that_raises_approval_required_waits_the_same_way(
    campaign: Campaign, inspector: Inspector
) -> None:
    """Its first call is a step whose recorded outcome is the deferral: replayed by the
    fresh process, the tool does not run again to ask; once approved it runs as a new
    step, after the approval's, with ``ctx.tool_call_approved``."""
    wid = campaign.ids["ask"]
    assert [s.name for s in campaign.at_kill["ask"]] == [MODEL, TRANSFER, ASK, WAIT]
    assert campaign.at_kill["ask"][1].output == {
        "kind": "approval_required",
        "metadata": {"limit": guarded_app.LIMIT},
    }
    (request,) = campaign.asked["ask"]
    assert (request["tool"], request["arguments"]) == ("transfer", {"amount": 500})
    assert campaign.results[wid] == "moved"
    assert pids_of(campaign.side_log, "transfer 500 asked") == [campaign.killed]
    assert pids_of(campaign.side_log, "transfer 500 done") == [campaign.resumed]
    steps = inspector.steps(wid)
    assert [s.name for s in steps] == [MODEL, TRANSFER, ASK, WAIT, TRANSFER, MODEL]
    assert len(set(paid(campaign.requests, "ask"))) == 2
    rows = [(s.name, str(s.status), s.output, s.attempts) for s in steps]
    assert totals_from_steps(wid, rows).tool_calls == 1  # the deferral was not a call


# --------------------------------------------------------------------- in this process


@da.durable_workflow(name="pai_test_guarded_both")
async def guarded_both(task: str) -> str:
    return (await guarded_app.guard.run(task)).output


def test_every_call_is_asked_before_the_first_wait_decided_over_http_and_replayed(
    runtime: da.Runtime,
    dbos_agent_database_url: str,
    inspector: Inspector,
    model_server: ScriptedServer,
    side_log: Path,
) -> None:
    """Both calls that need a human are listed at once (the run suspends waiting for the
    first decision); decided over HTTP, the approved one runs, the one under the limit ran
    at once; a fork from the last model request replays requests, decisions and tools."""
    handle = da.start(guarded_both, "both")
    wid = handle.workflow_id
    with (
        Server(dbos_agent_database_url, TOKEN) as web,
        httpx.Client(
            base_url=web.base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as api,
    ):

        def listed() -> list[dict[str, Any]]:
            response = api.get(f"/api/workflows/{wid}/approvals")
            assert response.status_code == 200, response.text
            return sorted(response.json(), key=lambda a: a["seq"])

        wait_until(lambda: len(listed()) == 2, 30, "both calls asked about")
        wait_until(
            lambda: inspector.status(wid) == da.WorkflowStatus.SUSPENDED, 30, "the run suspended"
        )
        transfer, delete = listed()
        assert (transfer["tool"], transfer["arguments"]) == ("transfer", {"amount": 900})
        assert (delete["tool"], delete["arguments"]) == ("delete", {"path": "draft.txt"})
        forged = api.post(
            f"/api/workflows/{wid}/approvals/{delete['seq']}",
            json={"approve": True, "digest": transfer["digest"]},
        )
        assert forged.status_code == 409 and "other arguments" in forged.json()["error"]
        for request, approve in ((transfer, True), (delete, False)):
            decided = api.post(
                f"/api/workflows/{wid}/approvals/{request['seq']}",
                json={"approve": approve, "digest": request["digest"], "reason": "not now"},
            )
            assert decided.status_code == 200, decided.text
    assert handle.result(timeout=30) == "both decided"
    results = [r["content"][0]["text"] for r in tool_results(model_server.requests, "both")]
    assert sorted(results) == [
        "A human rejected this call: not now",
        "moved 20",
        "moved 900",
    ]
    assert [s.name for s in inspector.steps(wid)] == [
        MODEL,
        TRANSFER,  # 900: the deferral
        TRANSFER,  # 20: under the limit
        ASK,
        ASK,
        WAIT,
        WAIT,
        TRANSFER,  # 900, approved
        MODEL,
    ]
    effects = lines(side_log)
    assert "delete draft.txt" not in effects and effects.count("transfer 900 done") == 1

    last = inspector.steps(wid)[-1].seq
    fork = da.operations.fork(wid, from_step=last)
    assert fork.result(timeout=30) == "both decided"
    assert lines(side_log) == effects  # no tool ran again, none asked again
    statuses = {(a.seq, a.status) for a in da.operations.list_approvals(wid)}
    assert statuses == {(transfer["seq"], "APPROVED"), (delete["seq"], "REJECTED")}
    assert {(a.seq, a.status) for a in da.operations.list_approvals(fork.workflow_id)} == statuses
    assert [s.name for s in inspector.steps(fork.workflow_id)] == [
        s.name for s in inspector.steps(wid)
    ]


@da.durable_workflow(name="pai_test_guarded_sync")
def guarded_sync(task: str) -> str:
    return guarded_app.guard.run_sync(task).output


def test_run_sync_in_a_sync_workflow_waits_the_same_way(
    runtime: da.Runtime,
    inspector: Inspector,
    model_server: ScriptedServer,
    side_log: Path,
) -> None:
    handle = da.start(guarded_sync, "sync")
    wait_until(lambda: da.operations.list_approvals(handle.workflow_id), 30, "the call asked about")
    (request,) = da.operations.list_approvals(handle.workflow_id)
    da.operations.reject(handle.workflow_id, request.seq, request.digest)
    assert handle.result(timeout=30) == "not deleted"
    (result,) = tool_results(model_server.requests, "sync")
    assert result["content"][0]["text"] == "A human rejected this call."
    assert [s.name for s in inspector.steps(handle.workflow_id)] == [MODEL, ASK, WAIT, MODEL]
    assert lines(side_log) == []


@da.durable_workflow(name="pai_test_guarded_events")
async def guarded_events(task: str) -> str:
    output = (await guarded_app.narrated_guard.run(task)).output
    await da.aio.close_stream(DEFAULT_EVENTS_KEY)
    return output


def test_with_the_runs_events_in_a_stream_the_wait_replays_the_same(
    runtime: da.Runtime,
    inspector: Inspector,
    model_server: ScriptedServer,
    side_log: Path,
) -> None:
    """The run suspends while it waits and is woken by the decision: its replay up to the
    wait goes through the event writes and the approval's steps without diverging, and
    the stream has each event once; so does a fork from the last model request."""
    handle = da.start(guarded_events, "events")
    wid = handle.workflow_id
    wait_until(lambda: inspector.status(wid) == da.WorkflowStatus.SUSPENDED, 30, "suspended")
    (request,) = da.operations.list_approvals(wid)
    da.operations.approve(wid, request.seq, request.digest)
    assert handle.result(timeout=30) == "moved 700"

    def kinds(workflow_id: str) -> list[str]:
        items = da.read_stream(workflow_id, DEFAULT_EVENTS_KEY, timeout=10)
        return [i.value["event_kind"] for i in items if i.step is None]

    workflow_side = kinds(wid)
    assert workflow_side.count("deferred_tool_requests") == 1
    assert workflow_side.count("function_tool_result") == 1
    assert lines(side_log) == ["transfer 700 asked", "transfer 700 done"]
    requests = [s for s in inspector.steps(wid) if s.name == "narrated_guard__model.request_stream"]
    fork = da.operations.fork(wid, from_step=requests[-1].seq)
    assert fork.result(timeout=30) == "moved 700"
    assert kinds(fork.workflow_id) == workflow_side
    assert lines(side_log) == ["transfer 700 asked", "transfer 700 done"]


def test_outside_a_workflow_the_run_ends_with_the_deferred_requests(
    model_server: ScriptedServer, side_log: Path
) -> None:
    output_type: list[type[Any]] = [str, DeferredToolRequests]
    result: AgentRunResult[Any] = asyncio.run(
        guarded_app.guard.run("plain", output_type=output_type)
    )
    output = result.output
    assert isinstance(output, DeferredToolRequests)
    (call,) = output.approvals
    assert (call.tool_name, call.args_as_dict()) == ("delete", {"path": "plain.txt"})
    assert lines(side_log) == []


@da.durable_workflow(name="pai_test_own_approvals")
async def own_approvals(task: str) -> str:
    """Pydantic AI's own approval flow in a workflow: a run that ends with the deferred
    requests, then a run that continues the history with every call approved."""
    output_type: list[type[Any]] = [str, DeferredToolRequests]
    first: AgentRunResult[Any] = await guarded_app.own_guard.run(task, output_type=output_type)
    deferred = first.output
    assert isinstance(deferred, DeferredToolRequests)
    approved = DeferredToolResults(approvals={c.tool_call_id: True for c in deferred.approvals})
    second: AgentRunResult[Any] = await guarded_app.own_guard.run(
        message_history=first.all_messages(),
        deferred_tool_results=approved,
        output_type=output_type,
    )
    return str(second.output)


def test_with_approvals_off_the_run_ends_with_its_deferred_requests_in_a_workflow_too(
    runtime: da.Runtime, inspector: Inspector, model_server: ScriptedServer, side_log: Path
) -> None:
    """``Durability(approvals=False)``: nothing is asked as a dbos_agent approval; the
    workflow's second run runs the approved call once, as its tool step, and a fork from
    the last request replays it without running it again."""
    handle = da.start(own_approvals, "own")
    wid = handle.workflow_id
    assert handle.result(timeout=30) == "deleted own"
    assert da.operations.list_approvals(wid) == []
    own_model, own_delete = (
        "own_guard__model.request",
        "own_guard__function_toolset__ops.call_tool:delete",
    )
    steps = inspector.steps(wid)
    assert [s.name for s in steps] == [own_model, own_delete, own_model]
    assert lines(side_log) == ["delete own.txt"]
    fork = da.operations.fork(wid, from_step=steps[-1].seq)
    assert fork.result(timeout=30) == "deleted own"
    assert lines(side_log) == ["delete own.txt"]
