"""MCP tools as durable steps: a real stdio MCP server (tests/apps/mcp_server_app.py) started by
the registry, its effects counted from the file it appends to.

* the listing is one step per run, replayed; each call is a step; a replayed run never
  starts the server;
* ``isError`` results are recorded results (not retried) and reach the model as such;
* a server killed mid-call is reconnected and an idempotent call tried again, a
  non-idempotent one is not sent again (an ``is_error`` result), a hung one times out;
* approvals and the sync registry work as for function tools;
* across a kill -9 of the agent process a finished MCP call is not repeated, and the
  resumed process runs the workflow body once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ToolResultBlockParam, ToolUseBlock
from mcp import ClientSession, StdioServerParameters, stdio_client

import dbos_agent as da
from dbos_agent.agent import ToolOptions, ToolRegistry
from dbos_agent.agent.mcp import AsyncOnlyToolError
from dbos_agent.agent.scripted_server import Reply as ScriptedReply
from dbos_agent.agent.scripted_server import ScriptedServer, text, tool_use
from dbos_agent.testing import Inspector
from tests.helpers import SimulatedCrash, new_id, wait_until
from tests.processes import output
from tests.support import zygote

pytestmark = pytest.mark.long  # many processes, a minute or more: started first

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).parents[1] / "apps" / "mcp_server_app.py"
LISTING = "mcp:list_tools:mcp_server_app"
TOOL_NAMES = ["add", "append", "big", "refuse", "slow_once"]
CURRENT: dict[str, Any] = {}


def parameters(log: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=zygote.through([str(SERVER)]),
        env={"MCP_SIDE_EFFECTS": str(log)},
    )


def effects(log: Path, *words: str) -> list[list[str]]:
    """The lines of the side-effect log that start with ``words`` (split, pid last)."""
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines()]
    return [row for row in rows if row[: len(words)] == list(words)]


def use(n: int, name: str, **tool_input: Any) -> ToolUseBlock:
    return ToolUseBlock(type="tool_use", id=f"toolu_{n:02d}", name=name, input=tool_input)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "effects.log"


@pytest.fixture
def registry(log: Path) -> Iterator[Any]:
    """Make registries on ``log``'s server (options as for ``from_mcp``); closed after."""
    made: list[ToolRegistry] = []

    def make(**options: Any) -> ToolRegistry:
        made.append(ToolRegistry.from_mcp(parameters(log), errlog=_devnull(), **options))
        CURRENT["tools"] = made[-1]
        return made[-1]

    yield make
    for item in made:
        item.close()
    CURRENT.clear()


def _devnull() -> Any:
    return open(os.devnull, "w")


def kill_server(log: Path) -> None:
    """SIGKILL the server process that is running now (the last one started)."""
    os.kill(int(effects(log, "server-start")[-1][-1]), signal.SIGKILL)


@da.durable_workflow(name="mcp_tools_sync_agent")
def sync_agent(blocks: list[ToolUseBlock]) -> list[ToolResultBlockParam]:
    tools: ToolRegistry = CURRENT["tools"]
    names = [param["name"] for param in tools.params()]  # lists the tools: a step
    assert names == TOOL_NAMES, names
    first = tools.call_all(blocks[:1])  # the run has its listing: no second one
    rest = tools.call_all(blocks[1:], parallel=True)
    if CURRENT.pop("crash", False):
        raise SimulatedCrash()
    return first + rest


def test_the_listing_is_one_step_per_run_and_a_replay_never_starts_the_server(
    runtime: da.Runtime, inspector: Inspector, registry: Any, log: Path
) -> None:
    registry()
    wid = new_id("mcp-sync")
    blocks = [use(0, "add", a=1, b=2), use(1, "add", a=3, b=4), use(2, "add", a=5, b=6)]
    CURRENT["crash"] = True
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        sync_agent(blocks)
    assert inspector.step_names(wid) == [LISTING, "tool:add", "tool:add", "tool:add"]
    listing = inspector.steps(wid)[0].output
    assert [tool["name"] for tool in listing] == TOOL_NAMES
    assert len(effects(log, "server-start")) == 1 and len(effects(log, "add")) == 3

    registry()  # a fresh registry, as in a new process: its server is never needed
    with da.workflow_id(wid):
        results = sync_agent(blocks)
    assert [r["content"] for r in results] == ["3", "7", "11"]
    assert len(effects(log, "server-start")) == 1 and len(effects(log, "add")) == 3
    assert inspector.step_names(wid) == [LISTING, "tool:add", "tool:add", "tool:add"]


@da.durable_workflow(name="mcp_tools_async_calls")
async def async_calls(blocks: list[ToolUseBlock]) -> list[ToolResultBlockParam]:
    tools: ToolRegistry = CURRENT["tools"]
    return await tools.call_all_async(blocks)


@da.durable_workflow(name="mcp_tools_async_turns")
async def async_turns(turns: list[list[ToolUseBlock]]) -> list[ToolResultBlockParam]:
    """The calls of each turn together, turn after turn."""
    tools: ToolRegistry = CURRENT["tools"]
    return [result for blocks in turns for result in await tools.call_all_async(blocks)]


def test_error_results_are_recorded_results_and_not_retried(
    runtime: da.Runtime, inspector: Inspector, registry: Any, log: Path
) -> None:
    registry(retries=3)  # step retries are for exceptions; an isError result is an answer
    handle = da.start(
        async_calls,
        [use(0, "refuse", reason="no"), use(1, "add", a="x", b=1), use(2, "nope")],
    )
    refused, invalid, unknown = handle.result(timeout=60)
    assert refused == {
        "type": "tool_result",
        "tool_use_id": "toolu_00",
        "content": "Error executing tool refuse: refused: no",  # the server's own words
        "is_error": True,
    }
    assert invalid.get("is_error") and "validation error" in str(invalid["content"])
    assert unknown.get("is_error") and "unknown tool 'nope'" in str(unknown["content"])
    assert len(effects(log, "refuse")) == 1
    steps = inspector.steps(handle.workflow_id)
    assert [s.name for s in steps] == [
        LISTING,
        "tool:refuse",
        "tool:add",
        "tool_call_rejected",
    ]
    assert steps[1].output["is_error"] is True and steps[1].attempts == 1
    assert steps[1].status == "SUCCESS"


def test_a_server_killed_mid_call_is_restarted_and_an_idempotent_call_tried_again(
    runtime: da.Runtime, registry: Any, log: Path
) -> None:
    registry()
    handle = da.start(async_calls, [use(0, "slow_once", label="k", seconds=3600)])
    wait_until(lambda: effects(log, "slow-start", "k"), 30, "the call to start")
    kill_server(log)
    (result,) = handle.result(timeout=60)
    assert result["content"] == "done k" and not result.get("is_error")
    assert len(effects(log, "server-start")) == 2 and len(effects(log, "slow-start")) == 2


def test_a_non_idempotent_call_cut_off_by_its_server_is_an_error_and_never_resent(
    runtime: da.Runtime, registry: Any, log: Path
) -> None:
    options: dict[str, ToolOptions] = {"slow_once": {"idempotent": False}}
    registry(tool_options=options)
    handle = da.start(
        async_turns, [[use(0, "slow_once", label="k", seconds=3600)], [use(1, "add", a=1, b=1)]]
    )
    wait_until(lambda: effects(log, "slow-start", "k"), 30, "the call to start")
    kill_server(log)
    cut, after = handle.result(timeout=60)
    assert cut.get("is_error") and "may or may not have run" in str(cut["content"])
    assert len(effects(log, "slow-start")) == 1  # not sent again
    assert after["content"] == "2"  # the next turn's call started a new server
    assert len(effects(log, "server-start")) == 2


def test_a_hung_call_times_out_as_an_error_result(
    runtime: da.Runtime, registry: Any, log: Path
) -> None:
    registry(tool_options={"slow_once": {"timeout": 1.0}})
    handle = da.start(async_calls, [use(0, "slow_once", label="h", seconds=3600)])
    (result,) = handle.result(timeout=60)
    assert result.get("is_error") and "within 1" in str(result["content"]), result


def test_mcp_tools_that_require_approval_wait_for_a_human(
    runtime: da.Runtime, registry: Any, log: Path
) -> None:
    registry(tool_options={"append": {"requires_approval": True}})
    handle = da.start(
        async_calls,
        [use(0, "append", text="yes"), use(1, "append", text="no"), use(2, "add", a=2, b=2)],
    )

    def pending() -> list[da.operations.ApprovalRequest]:
        return [
            a for a in da.operations.list_approvals(handle.workflow_id) if a.status == "PENDING"
        ]

    wait_until(pending, 30, "the first approval request")
    first = pending()[0]
    assert (first.tool, first.arguments) == ("append", {"text": "yes"})
    da.operations.approve(handle.workflow_id, first.seq, first.digest)
    wait_until(lambda: pending() and pending()[0].seq != first.seq, 30, "the second request")
    second = pending()[0]
    da.operations.reject(handle.workflow_id, second.seq, second.digest, reason="not this one")
    approved, rejected, added = handle.result(timeout=60)
    assert approved["content"] == "appended yes"
    assert rejected.get("is_error") and "not this one" in str(rejected["content"])
    assert added["content"] == "4"
    assert [row[1] for row in effects(log, "append")] == ["yes"]


def test_a_session_given_by_the_application_is_used_on_its_loop(log: Path) -> None:
    """Outside a workflow, with the application's own ClientSession: calls run on its
    loop; sync use from that loop's thread is refused (it would block the session)."""

    async def main() -> list[ToolResultBlockParam]:
        async with (
            stdio_client(parameters(log), errlog=_devnull()) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            tools = ToolRegistry.from_mcp(session, server_name="app_session")
            with pytest.raises(AsyncOnlyToolError):
                tools.params()
            return await tools.call_all_async([use(0, "add", a=20, b=22)])

    (result,) = asyncio.run(main())
    assert result["content"] == "42"


def script(body: dict[str, Any]) -> ScriptedReply:
    """Turn 0: append A; turn 1: a slow call (killed there the first time); then done."""
    turn = sum(1 for message in body["messages"] if message["role"] == "assistant")
    if turn == 0:
        return ScriptedReply((tool_use("append", {"text": "A"}, id="toolu_a"),))
    if turn == 1:
        return ScriptedReply(
            (tool_use("slow_once", {"label": "B", "seconds": 3600}, id="toolu_b"),)
        )
    return ScriptedReply((text("finished"),))


def test_an_mcp_call_before_a_kill_9_is_not_repeated_and_the_body_runs_once(
    dbos_agent_database_url: str, inspector: Inspector, log: Path
) -> None:
    wid = new_id("mcp-kill")
    with ScriptedServer(script) as model:
        env = {
            **os.environ,
            "DBOS_AGENT_DATABASE_URL": dbos_agent_database_url,
            "MODEL_URL": model.url,
            "MCP_SIDE_EFFECTS": str(log),
            "PYTHONPATH": str(ROOT),
        }
        command = [sys.executable, "-m", "tests.apps.mcp_agent_app", wid]
        first = zygote.popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: effects(log, "slow-start", "B"), 60, "the slow MCP call")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        finally:
            if first.poll() is None:
                first.kill()
        with contextlib.suppress(ProcessLookupError):  # it may have ended with its stdin
            kill_server(log)  # if not, it would: do not wait for that
        assert len(model.requests) == 2
        resumed = zygote.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert resumed.returncode == 0, output(resumed)
    assert json.loads(resumed.stdout.splitlines()[-1]) == "finished"
    assert len(model.requests) == 3  # turns 0 and 1 were not asked (nor paid) again
    for request in model.requests:  # each model call offered the MCP tools, resumed too
        assert [t["name"] for t in request.body["tools"]] == TOOL_NAMES
    assert len(effects(log, "append", "A")) == 1  # the finished MCP call did not repeat
    assert len(effects(log, "slow-start", "B")) == 2  # the one cut off ran again (at least once)
    # the resumed process ran the body once, not twice at once
    runs = [(row[0], row[-1]) for row in effects(log) if row[0] in ("wf-start", "wf-end")]
    pids = list(dict.fromkeys(pid for _, pid in runs))
    assert len(pids) == 2, runs
    assert [event for event, pid in runs if pid == pids[0]] == ["wf-start"]
    assert [event for event, pid in runs if pid == pids[1]] == ["wf-start", "wf-end"], runs
    assert inspector.step_names(wid) == [
        LISTING,
        "anthropic.messages",
        "tool:append",
        "anthropic.messages",
        "tool:slow_once",
        "anthropic.messages",
    ]
