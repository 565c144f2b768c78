"""Pydantic AI agents made durable by ``dbos_agent.integrations.pydantic_ai.Durability``.

The agents (tests/apps/pydantic_ai_app.py) use Pydantic AI's own Anthropic model over real HTTP
to the scripted Messages API server, which counts every request it answers; the crash
tests run the app as a subprocess, kill it with SIGKILL, run it again, and count from
outside the process: the server's request log, the side-effect file (each run of a
workflow body, each tool call, with the pid) and the step log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from collections import Counter
from collections.abc import AsyncIterable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelResponse, ToolCallPart

import dbos_agent as da
from dbos_agent.agent import usage_totals
from dbos_agent.agent.replay import track_replay
from dbos_agent.agent.scripted.request_log import RequestRecord
from dbos_agent.agent.scripted_server import Fail, Reply, ScriptedServer, ScriptItem, text, tool_use
from dbos_agent.records import StepInfo, describe_step
from dbos_agent.testing import Inspector
from tests.apps import pydantic_ai_app as app
from tests.helpers import new_id, wait_until
from tests.processes import output, start_module

ROOT = Path(__file__).resolve().parents[2]
ADD = "calc__function_toolset__math.call_tool:add"
SLOW = "calc__function_toolset__math.call_tool:slow"
SEND = "calc__function_toolset__math.call_tool:send"
MODEL = "calc__model.request"

Serve = Callable[[list[ScriptItem]], ScriptedServer]

#: Three turns: add(1, 2), add(3, 4), then the answer.
TWO_ADDS: list[ScriptItem] = [
    Reply((tool_use("add", {"a": 1, "b": 2}),)),
    Reply((tool_use("add", {"a": 3, "b": 4}),)),
    Reply((text("the answer is 10"),)),
]


@pytest.fixture
def side_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "side.log"
    monkeypatch.setenv("SIDE_LOG", str(log))
    return log


@pytest.fixture
def serve() -> Iterator[Callable[[list[ScriptItem]], ScriptedServer]]:
    """Start a scripted server with a script, the app's agents (in this process) on it."""
    started: list[tuple[ScriptedServer, str]] = []

    def start(script: list[ScriptItem]) -> ScriptedServer:
        server = ScriptedServer(script).start()
        started.append((server, app.use_server(server.url)))
        return server

    yield start
    for server, previous in reversed(started):
        app.use_server(previous)
        server.stop()


def lines(log: Path) -> list[str]:
    """The side-effect log without its pids."""
    return [line.rsplit(" ", 1)[0] for line in log.read_text().splitlines()] if log.exists() else []


def pids_of(log: Path, entry: str) -> list[int]:
    """The pids that logged ``entry``, in order."""
    return [
        int(line.rsplit(" ", 1)[1])
        for line in log.read_text().splitlines()
        if line.rsplit(" ", 1)[0] == entry
    ]


# ------------------------------------------------------------------ in-process runs


CURRENT: dict[str, Any] = {}


@da.durable_workflow(name="pai_test_tracked")
async def tracked(task: str) -> str:
    """``solve``, keeping what a test looks at: the replay report and the run's messages."""
    track_replay(CURRENT.setdefault("reports", []).append)
    result = await app.calc.run(task)
    CURRENT["messages"] = result.all_messages()
    return result.output


def test_each_model_request_and_tool_call_is_a_step_and_replays_typed(
    runtime: da.Runtime, inspector: Inspector, serve: Serve, side_log: Path
) -> None:
    server = serve([*TWO_ADDS, Reply((text("the answer is still 10"),))])
    CURRENT.clear()
    wid = new_id("pai-async")
    with da.workflow_id(wid):
        assert asyncio.run(tracked("compute")) == "the answer is 10"
    steps = inspector.steps(wid)
    assert [s.name for s in steps] == [MODEL, ADD, MODEL, ADD, MODEL]
    reply = steps[0].output
    assert reply["model"] == app.MODEL_NAME and reply["usage"]["output_tokens"] > 0
    assert reply["response"]["parts"][0]["tool_name"] == "add"
    assert [s.output["result"] for s in steps if s.name == ADD] == [3, 7]
    assert len(server.requests) == 3
    assert CURRENT["reports"] == []  # a fresh run replays nothing
    # the agent layer counts these replies: totals, and `dbos-agent steps`' description
    totals = usage_totals(wid)
    assert (totals.model_calls, totals.tool_calls) == (3, 2)
    assert totals.input_tokens == sum(s.output["usage"]["input_tokens"] for s in steps[::2])
    assert totals.cost_usd is not None and totals.cost_usd > 0
    digest = describe_step(da.operations.list_steps(wid)[0])
    assert digest is not None and digest.summary == '[tool_call] add({"a": 1, "b": 2})'
    assert digest.input_tokens == reply["usage"]["input_tokens"]

    # A fork from the last model request replays the first four steps, typed: the agent
    # gets ModelResponses back (and runs on from their tool calls), calls nothing again,
    # and makes only the last request live.
    CURRENT.clear()
    fork = da.operations.fork(wid, from_step=4)
    assert fork.result(timeout=30) == "the answer is still 10"
    assert [s.name for s in inspector.steps(fork.workflow_id)] == [MODEL, ADD, MODEL, ADD, MODEL]
    assert len(server.requests) == 4
    assert lines(side_log).count("add 1 2 start") == 1  # not run again by the fork
    responses = [m for m in CURRENT["messages"] if isinstance(m, ModelResponse)]
    assert len(responses) == 3
    call = responses[0].parts[0]
    assert isinstance(call, ToolCallPart) and call.args_as_dict() == {"a": 1, "b": 2}
    assert responses[0].model_name == app.MODEL_NAME and responses[0].usage.output_tokens > 0
    (report,) = CURRENT["reports"]
    assert (report.steps_replayed, report.model_calls_replayed, report.tool_calls_replayed) == (
        4,
        2,
        2,
    )
    assert report.input_tokens_saved == sum(s.output["usage"]["input_tokens"] for s in steps[:3:2])


def test_run_sync_in_a_sync_workflow(
    runtime: da.Runtime, inspector: Inspector, serve: Serve, side_log: Path
) -> None:
    server = serve(TWO_ADDS)
    handle = da.start(app.solve_sync, "compute")
    assert handle.result(timeout=30) == "the answer is 10"
    assert [s.name for s in inspector.steps(handle.workflow_id)] == [MODEL, ADD, MODEL, ADD, MODEL]
    assert len(server.requests) == 3
    assert lines(side_log).count("add 3 4 end") == 1


def test_parallel_calls_take_positions_in_reply_order_whichever_reaches_its_step_first(
    runtime: da.Runtime, inspector: Inspector, serve: Serve, side_log: Path
) -> None:
    """``send`` is not idempotent: it records its intent from a worker thread before it
    runs, so the two ``slow`` calls after it in the reply reach their steps first; each
    call still takes the position reserved for its place in the reply."""
    serve(
        [
            Reply(
                (
                    tool_use("send", {"to": "bob"}),
                    tool_use("slow", {"i": 2}),
                    tool_use("slow", {"i": 3}),
                )
            ),
            Reply((text("done"),)),
        ]
    )
    handle = da.start(app.solve, "compute")
    assert handle.result(timeout=30) == "done"
    steps = inspector.steps(handle.workflow_id)
    assert [s.name for s in steps] == [MODEL, SEND, SLOW, SLOW, MODEL]
    assert [s.output["result"] for s in steps[1:4]] == ["sent to bob", 20, 30]


@da.durable_workflow(name="pai_test_streamed")
async def streamed(task: str) -> str:
    """``solve`` with an event stream handler: Pydantic AI streams its model requests."""

    async def handle(ctx: Any, events: AsyncIterable[Any]) -> None:
        async for event in events:
            CURRENT.setdefault("events", []).append(type(event).__name__)

    return (await app.calc.run(task, event_stream_handler=handle)).output


def test_streamed_requests_are_steps_their_events_live_once(
    runtime: da.Runtime, inspector: Inspector, serve: Serve, side_log: Path
) -> None:
    CURRENT.clear()
    server = serve(TWO_ADDS)
    handle = da.start(streamed, "compute")
    assert handle.result(timeout=30) == "the answer is 10"
    stream = "calc__model.request_stream"
    assert [s.name for s in inspector.steps(handle.workflow_id)] == [
        stream,
        ADD,
        stream,
        ADD,
        stream,
    ]
    assert [r.stream for r in server.requests] == [True, True, True]
    assert CURRENT["events"].count("FunctionToolResultEvent") == 2
    assert usage_totals(handle.workflow_id).model_calls == 3


@da.durable_workflow(name="pai_test_model_error")
async def model_error(task: str) -> str:
    """What the run raised, as the workflow saw it; then a step to fork from."""
    try:
        outcome = (await app.calc.run(task)).output
    except ModelHTTPError as error:
        outcome = f"{type(error).__name__} {error.status_code} {error.model_name}"
    await da.aio.sleep(0)
    return outcome


def test_a_model_error_is_recorded_whole_and_raised_again_on_replay(
    runtime: da.Runtime, inspector: Inspector, serve: Serve
) -> None:
    """The step records Pydantic AI's encoding of the error, so a replay raises the same
    class with its status code, not a bare message of the right name. (A 400: an error
    that may pass by itself, a 500, is waited out instead, see test_dependency_outages.)"""
    server = serve([Fail(400, message="messages: bad shape")])
    handle = da.start(model_error, "compute")
    expected = f"ModelRequestRejectedError 400 {app.MODEL_NAME}"
    assert handle.result(timeout=30) == expected
    failed = inspector.steps(handle.workflow_id)[0]
    assert (failed.name, failed.status) == (MODEL, "ERROR")
    fork = da.operations.fork(handle.workflow_id, from_step=1)  # replays the failed request
    assert fork.result(timeout=30) == expected
    assert len(server.requests) == 1


# ------------------------------------------------------------- kill -9 and run again
#
# One campaign for the crash tests (two processes, not two per test): a first process
# starts one workflow per scenario, all at once; each hangs at its kill point; once all
# are there the process is killed with SIGKILL, and a second one (same executor id: it
# recovers them at launch, and attaches to them as it starts them again) finishes them.

#: The model's turns per scenario (each workflow's task), answered by the one server.
SCRIPTS: dict[str, list[ScriptItem]] = {
    # killed in its second tool call, after its second model request
    "kill": TWO_ADDS,
    # the same in a sync workflow (run_sync)
    "sync": [
        Reply((tool_use("add", {"a": 5, "b": 6}),)),
        Reply((tool_use("add", {"a": 7, "b": 8}),)),
        Reply((text("the answer is 26"),)),
    ],
    # four calls of one reply run at once; the odd ones hang at the kill
    "parallel": [
        Reply(tuple(tool_use("slow", {"i": i}) for i in range(4))),
        Reply((text("all four done"),)),
    ],
    # a non-idempotent tool killed after its effect, before its result is recorded
    "guard": [Reply((tool_use("send", {"to": "ann"}),)), Reply((text("sent it"),))],
    # an MCP call recorded, the next one killed mid-call
    "mcp": [
        Reply((tool_use("multiply", {"a": 6, "b": 7}),)),
        Reply((tool_use("multiply", {"a": 2, "b": 3}),)),
        Reply((text("42 and 6"),)),
    ],
}
WORKFLOW_OF = {
    "kill": "solve",
    "sync": "solve_sync",
    "parallel": "solve",
    "guard": "solve",
    "mcp": "solve_mcp",
}


def task_of(body: dict[str, Any]) -> str:
    """The scenario of a request: the task, the conversation's first user message."""
    content = body["messages"][0]["content"]
    return content if isinstance(content, str) else content[0]["text"]


def turn_of(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def paid(requests: list[RequestRecord], task: str) -> list[str]:
    """The conversations of ``task`` the server was paid to answer, as JSON."""
    return [
        json.dumps(r.body["messages"], sort_keys=True)
        for r in requests
        if r.paid and task_of(r.body) == task
    ]


@dataclass
class Campaign:
    """What the crash campaign left: the logs, the server's requests, the step logs."""

    ids: dict[str, str]
    killed: int
    resumed: int
    results: dict[str, Any]
    at_kill: dict[str, list[StepInfo]]
    requests: list[RequestRecord]
    side_log: Path
    mcp_log: Path

    def paid(self, task: str) -> list[str]:
        return paid(self.requests, task)


def start_app(url: str, ids: dict[str, str], env: dict[str, str]) -> subprocess.Popen[str]:
    calls = [f"{wid}={WORKFLOW_OF[task]}:{task}" for task, wid in ids.items()]
    return start_module(url, "tests.apps.pydantic_ai_app", *calls, env=env)


@pytest.fixture(scope="module")
def campaign(
    dbos_agent_database_url: str,
    dbos_agent_inspector: Inspector,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Campaign]:
    inspector = dbos_agent_inspector
    folder = tmp_path_factory.mktemp("pydantic-ai-crash")
    side_log, mcp_log = folder / "side.log", folder / "mcp.log"
    ids = {task: new_id(f"pai-{task}") for task in SCRIPTS}

    def kill_points_reached() -> bool:
        side, mcp = lines(side_log), lines(mcp_log)
        parallel = {s.seq for s in inspector.steps(ids["parallel"]) if s.status == "SUCCESS"}
        return (
            "add 3 4 start" in side
            and "add 7 8 start" in side
            and {1, 3} <= parallel  # slow(0) and slow(2) recorded...
            and {"slow 1 start", "slow 3 start"} <= set(side)  # ...slow(1), slow(3) hang
            and "sent ann" in side
            and "multiply 2 3" in mcp
        )

    def answer(body: dict[str, Any]) -> ScriptItem:
        script = SCRIPTS[task_of(body)]
        return script[min(turn_of(body), len(script) - 1)]

    with ScriptedServer(answer) as server:
        env = {"MODEL_URL": server.url, "SIDE_LOG": str(side_log), "MCP_LOG": str(mcp_log)}
        hanging = {"HANG_AT": "add:3,add:7,slow:odd,sent", "MCP_HANG": "2"}
        first = start_app(dbos_agent_database_url, ids, {**env, **hanging})
        try:
            wait_until(
                lambda: first.poll() is not None or kill_points_reached(), 50, "the kill points"
            )
            assert first.poll() is None, first.communicate()[1]
        finally:
            first.kill()  # SIGKILL
            first.communicate()
        at_kill = {task: inspector.steps(wid) for task, wid in ids.items()}
        second = start_app(dbos_agent_database_url, ids, env)
        out, err = second.communicate(timeout=90)
        assert second.returncode == 0, output(second, out, err)
        yield Campaign(
            ids=ids,
            killed=first.pid,
            resumed=second.pid,
            results=json.loads(out.strip().splitlines()[-1]),
            at_kill=at_kill,
            requests=server.requests,
            side_log=side_log,
            mcp_log=mcp_log,
        )


def test_the_campaign_ran_each_workflow_body_once_per_process(campaign: Campaign) -> None:
    """The process that continues the killed workflows recovers them at launch and also
    starts them again under their ids: each body runs once in it, never twice."""
    for task in SCRIPTS:
        assert pids_of(campaign.side_log, f"{task} body start") == [
            campaign.killed,
            campaign.resumed,
        ], task
        assert pids_of(campaign.side_log, f"{task} body end") == [campaign.resumed], task


def test_killed_in_its_second_tool_call_it_continues_without_paying_twice(
    campaign: Campaign, inspector: Inspector
) -> None:
    assert campaign.results[campaign.ids["kill"]] == "the answer is 10"
    assert [s.name for s in campaign.at_kill["kill"]] == [MODEL, ADD, MODEL]
    paid = campaign.paid("kill")
    assert len(paid) == 3 and len(set(paid)) == 3  # each request exactly once
    adds = [line for line in lines(campaign.side_log) if line.startswith(("add 1", "add 3"))]
    assert adds == [
        "add 1 2 start",
        "add 1 2 end",
        "add 3 4 start",  # killed here
        "add 3 4 start",  # the next process: replays add(1, 2), runs add(3, 4) again
        "add 3 4 end",
    ]
    assert pids_of(campaign.side_log, "add 3 4 end") == [campaign.resumed]
    assert [s.name for s in inspector.steps(campaign.ids["kill"])] == [
        MODEL,
        ADD,
        MODEL,
        ADD,
        MODEL,
    ]


def test_a_sync_workflow_killed_in_run_sync_continues_the_same_way(
    campaign: Campaign, inspector: Inspector
) -> None:
    assert campaign.results[campaign.ids["sync"]] == "the answer is 26"
    paid = campaign.paid("sync")
    assert len(paid) == 3 and len(set(paid)) == 3
    adds = [line for line in lines(campaign.side_log) if line.startswith(("add 5", "add 7"))]
    assert adds == ["add 5 6 start", "add 5 6 end", "add 7 8 start", "add 7 8 start", "add 7 8 end"]
    assert [s.name for s in inspector.steps(campaign.ids["sync"])] == [
        MODEL,
        ADD,
        MODEL,
        ADD,
        MODEL,
    ]


def test_parallel_tool_calls_keep_their_reserved_positions_across_a_kill(
    campaign: Campaign, inspector: Inspector
) -> None:
    """Four calls of one reply ran at once; the process was killed once the even ones
    were recorded: the next process ran only the odd ones again, and each call's result is
    at the position its place in the reply gave it, whatever order they finished in."""
    assert campaign.results[campaign.ids["parallel"]] == "all four done"
    started = Counter(
        line for line in lines(campaign.side_log) if line.startswith("slow") and "start" in line
    )
    assert started == {"slow 0 start": 1, "slow 1 start": 2, "slow 2 start": 1, "slow 3 start": 2}
    assert len(campaign.paid("parallel")) == 2
    steps = inspector.steps(campaign.ids["parallel"])
    assert [s.name for s in steps] == [MODEL, SLOW, SLOW, SLOW, SLOW, MODEL]
    assert [s.output["result"] for s in steps[1:5]] == [0, 10, 20, 30]
    assert [s.seq for s in campaign.at_kill["parallel"] if s.status == "SUCCESS"] == [0, 1, 3]


def test_a_non_idempotent_tool_cut_off_after_its_effect_is_resolved_by_its_guard(
    campaign: Campaign, inspector: Inspector
) -> None:
    assert campaign.results[campaign.ids["guard"]] == "sent it"
    intent = campaign.at_kill["guard"][1]
    assert (intent.name, intent.status) == (SEND, "PENDING")  # its intent, no result
    assert lines(campaign.side_log).count("sent ann") == 1  # the guard saw it: not resent
    step = inspector.steps(campaign.ids["guard"])[1]
    assert (step.status, step.output) == (
        "SUCCESS",
        {"kind": "tool_return", "result": "sent to ann"},
    )
    assert len(campaign.paid("guard")) == 2


def test_an_mcp_call_recorded_before_the_kill_is_not_made_again(
    campaign: Campaign, inspector: Inspector
) -> None:
    assert campaign.results[campaign.ids["mcp"]] == "42 and 6"
    calls = [line.rsplit(" ", 1) for line in campaign.mcp_log.read_text().splitlines()]
    assert calls == [
        ["multiply 6 7", str(campaign.killed)],
        ["multiply 2 3", str(campaign.killed)],  # killed mid-call: made again
        ["multiply 2 3", str(campaign.resumed)],
    ]
    paid = campaign.paid("mcp")
    assert len(paid) == 3 and len(set(paid)) == 3
    names = [s.name for s in inspector.steps(campaign.ids["mcp"])]
    call = "mcpcalc__mcp_server__calc.call_tool"
    assert call in names and "mcpcalc__mcp_server__calc.get_tools" in names
    assert names.count("mcpcalc__model.request") == 3 and names.count(call) == 2


def test_the_budget_refuses_a_call_its_family_cannot_afford(
    runtime: da.Runtime, inspector: Inspector, serve: Serve
) -> None:
    """The parent's reply spends 2,600 of the family's 3,000 tokens; its child's call, which
    may write 1,000 more, is refused before it is made, and the refusal is its record."""
    server = serve([Reply((text("first"),), usage=(2500, 100))])
    handle = da.start(app.budget_parent, "compute")
    first, second = handle.result(timeout=30)
    assert first == "first"
    assert second.startswith("BudgetExceededError") and "2,600 of its 3,000-token" in second
    assert len(server.requests) == 1  # the refused call was never made
    assert server.requests[0].body["max_tokens"] == 1000
    (child,) = inspector.workflows(name="pai_budget_child")
    assert child.status == "ERROR"
    steps = inspector.steps(child.workflow_id)
    refused = [s for s in steps if s.name == "budgeted__model.request"]
    assert len(refused) == 1 and refused[0].status == "ERROR"
    assert "BudgetExceededError" in str(refused[0].error)


def test_a_delegate_agents_requests_are_steps_its_family_budget_counts(
    runtime: da.Runtime, inspector: Inspector, serve: Serve
) -> None:
    """A tool run in the workflow's code (metadata ``{"dbos_agent": False}``) delegates to
    an agent without a budget: the helper's request is a step of the same workflow, the
    budget of the agent that delegates holds for it, and the total counts every reply."""
    server = serve(
        [
            Reply((tool_use("ask_helper", {"question": "six times seven?"}),), usage=(500, 100)),
            Reply((text("42"),), usage=(1000, 100)),
            Reply((text("the helper says 42"),), usage=(500, 100)),
        ]
    )
    handle = da.start(app.delegate, "ask")
    assert handle.result(timeout=30) == "the helper says 42"
    names = [s.name for s in inspector.steps(handle.workflow_id)]
    assert names.count("boss__model.request") == 2 and names.count("helper__model.request") == 1
    assert not [n for n in names if "ask_helper" in n]  # the delegating tool is no step
    assert [r.body["max_tokens"] for r in server.requests] == [1000, 1000, 1000]
    totals = usage_totals(handle.workflow_id)
    assert (totals.input_tokens, totals.output_tokens) == (2000, 300)


def test_a_delegate_is_refused_what_the_family_cannot_afford(
    runtime: da.Runtime, inspector: Inspector, serve: Serve
) -> None:
    """The boss's reply spends 2,600 of the family's 3,000 tokens: the helper it delegates
    to, which has no budget of its own, is refused its call (which may write 1,000) before
    it is made, by the budget it inherits."""
    server = serve(
        [Reply((tool_use("ask_helper", {"question": "q"}),), usage=(2500, 100))],
    )
    handle = da.start(app.delegate, "ask")
    with pytest.raises(da.errors.BudgetExceededError, match="2,600 of its 3,000-token"):
        handle.result(timeout=30)
    assert len(server.requests) == 1
    refused = [s for s in inspector.steps(handle.workflow_id) if s.name == "helper__model.request"]
    assert len(refused) == 1 and refused[0].status == "ERROR"


def test_a_delegate_inside_a_tool_step_under_a_budget_is_refused_loudly(
    runtime: da.Runtime, inspector: Inspector, serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool that is a step runs the helper inside that step, where its calls could be
    neither recorded nor charged: with a budget in force the call is refused with a
    ConfigurationError saying how to fix it (logged as an error), nothing is sent, and the
    workflow stays PENDING for a process with the fix."""
    server = serve([Reply((tool_use("ask_helper_in_step", {"question": "q"}),), usage=(10, 10))])
    with caplog.at_level(logging.ERROR, logger="dbos_agent"):
        handle = da.start(app.delegate_in_step, "ask")

        def stopped() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if handle.workflow_id in r.getMessage() and "stays PENDING" in r.getMessage()
            ]

        wait_until(stopped, 30, "the run stopped on the refusal")
    assert "metadata={'dbos_agent': False}" in stopped()[0]
    assert "helper" in stopped()[0]
    assert len(server.requests) == 1
    assert handle.status() == da.WorkflowStatus.PENDING
    names = [s.name for s in inspector.steps(handle.workflow_id)]
    assert names[-1] == "stepboss__model.request"  # the tool's step recorded nothing
    da.operations.cancel(handle.workflow_id)  # no later test's runtime takes it over
