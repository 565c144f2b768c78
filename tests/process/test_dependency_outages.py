"""An outage of what an agent depends on never becomes a workflow error: the model API
answering 529 for minutes, an MCP server that does not start or whose port is closed.
The workflow waits durably (SUSPENDED, no thread), says why, survives a kill -9, and goes
on by itself once the dependency is back; nothing is paid or done twice. Outages longer
than a test are made with the database clock (``advance_clock``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ToolResultBlockParam, ToolUseBlock

import dbos_agent as da
from dbos_agent.agent import Model, ToolRegistry, usage_totals
from dbos_agent.agent.scripted_server import Fail, Reply, ScriptedServer, ScriptItem, text
from dbos_agent.records import WorkflowStatus
from dbos_agent.testing import Inspector, advance_clock
from tests.helpers import new_id, until_done, wait_until
from tests.process.test_mcp_tools import effects, use
from tests.processes import output, start_module
from tests.support import zygote
from tests.support.web import free_port

pytestmark = pytest.mark.long  # a minute or more in the suite: started first

ROOT = Path(__file__).resolve().parents[2]
MCP_SERVER = Path(__file__).parents[1] / "apps" / "mcp_server_app.py"


class Outage:
    """A scripted Messages API that answers 529 while ``down``, and text after."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.down.set()

    def __call__(self, body: dict[str, Any]) -> ScriptItem:
        if self.down.is_set():
            return Fail(529, message="overloaded")
        return Reply([text("done: " + str(body["messages"][-1]["content"]))])


@pytest.fixture
def outage() -> Iterator[tuple[Outage, ScriptedServer]]:
    script = Outage()
    with ScriptedServer(script) as server:
        yield script, server


def _waiting_for(inspector: Inspector, wid: str, what: str, *, later_than: float = 0) -> bool:
    """The workflow is SUSPENDED for a retry of what it waits for, its next attempt at
    least ``later_than`` seconds after its last one failed."""
    info = inspector.workflow(wid)
    if info is None or info.status is not WorkflowStatus.SUSPENDED or info.retrying is None:
        return False
    gap = (info.retrying.next_at - info.retrying.since).total_seconds()
    return info.retrying.waiting_for == what and gap >= later_than


# --------------------------------------------------------------- the model API, kill -9


def test_a_model_outage_is_waited_out_suspended_across_a_kill(
    runtime: da.Runtime,  # the schema; it cannot run these agents (not imported here)
    dbos_agent_database_url: str,
    inspector: Inspector,
    outage: tuple[Outage, ScriptedServer],
) -> None:
    """529 from the start: each agent retries in process, then waits SUSPENDED, saying it
    waits for the model API; its process is killed -9; ten minutes later (the clock moved)
    the outage is over and a fresh process finishes every agent, each reply paid once."""
    script, server = outage
    wids = [new_id("outage") for _ in range(3)]
    env = {"MODEL_URL": server.url}
    first = start_module(dbos_agent_database_url, "tests.apps.outage_app", *wids, env=env)
    try:
        wait_until(
            lambda: all(_waiting_for(inspector, w, "the model API", later_than=3) for w in wids),
            60,
            "every agent to wait for the model API, suspended",
        )
        for wid in wids:
            info = inspector.workflow(wid)
            assert info is not None and info.retrying is not None
            assert info.retrying.step == "anthropic.messages"
            assert info.retrying.attempts >= 5
            assert "overloaded" in info.retrying.error_line()
        first.kill()
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    failed_before = len(server.requests)
    assert server.paid_calls == 0

    script.down.clear()  # the outage is over, ten minutes after it began
    env["ADVANCE_CLOCK"] = "600"
    second = start_module(dbos_agent_database_url, "tests.apps.outage_app", *wids, env=env)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, output(second, out, err)
    answers = json.loads(out.strip().splitlines()[-1])
    assert answers == {w: f"done: task {w}" for w in wids}
    assert server.paid_calls == len(wids)  # each reply paid once, none after
    assert len(server.requests) == failed_before + len(wids)
    for wid in wids:
        [step] = inspector.steps(wid)
        assert step.status == "SUCCESS" and step.attempts >= 6 and step.retry is None


# ------------------------------------------------------- 100 agents, no thread each


def engine_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("dbos-agent"))


MODEL: dict[str, Model] = {}


@da.durable_workflow(name="outage_inprocess_agent")
def one_call(task: str) -> str:
    reply = MODEL["model"].create([{"role": "user", "content": task}])
    return "".join(block.text for block in reply.content if block.type == "text")


def test_a_hundred_agents_wait_out_an_outage_holding_no_thread(
    runtime: da.Runtime, inspector: Inspector, outage: tuple[Outage, ScriptedServer]
) -> None:
    script, server = outage
    import anthropic

    MODEL["model"] = Model(
        anthropic.Anthropic(base_url=server.url, api_key="x"),
        retries=0,
        interval=5.0,
        max_interval=60.0,
        jitter=0.0,
    )
    wids = [new_id("flat") for _ in range(100)]
    before = engine_threads()
    for wid in wids:
        da.start(one_call, f"task {wid}", workflow_id=wid)
    wait_until(
        lambda: all(_waiting_for(inspector, w, "the model API") for w in wids),
        120,
        "every agent to wait, suspended",
    )
    # none held by a run (once the runs that wrote their rows have unwound)
    wait_until(lambda: runtime.running() == [], 30, "the suspended runs released")
    # at most the pool's 8 threads (started on first use), nothing per agent
    assert engine_threads() <= before + 8
    script.down.clear()
    advance_clock(10)
    for wid in wids:
        assert da.retrieve(wid).result(timeout=120) == f"done: task {wid}"
    assert server.paid_calls == 100
    # the failed attempts are charged nothing (a budget counts the same totals)
    assert usage_totals(wids[0]).model_calls == 1
    assert inspector.steps(wids[0])[0].attempts >= 2


# ---------------------------------------------------------------------- MCP servers

TOOLS: dict[str, Any] = {}


@da.durable_workflow(name="outage_mcp_calls")
async def mcp_calls(blocks: list[ToolUseBlock]) -> list[ToolResultBlockParam]:
    tools: ToolRegistry = TOOLS["tools"]
    return await tools.call_all_async(blocks)


@da.durable_workflow(name="outage_mcp_later")
async def mcp_later(blocks: list[ToolUseBlock]) -> list[ToolResultBlockParam]:
    """Lists the tools, waits for a go, then calls them (the server may go down between)."""
    tools: ToolRegistry = TOOLS["tools"]
    await tools.list_tools_async()
    await da.aio.recv("go")
    return await tools.call_all_async(blocks)


@pytest.fixture
def stdio_tools(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The registry of a stdio server that is down while ``down`` exists; (log, down).
    ``stdio_registry`` makes it again with other options."""
    log, down = tmp_path / "effects.log", tmp_path / "down"
    down.touch()
    with open(os.devnull, "w") as errlog:
        TOOLS["errlog"] = errlog
        stdio_registry(log, down)
        yield log, down
        TOOLS.pop("tools").close()


def stdio_registry(log: Path, down: Path, **options: Any) -> ToolRegistry:
    from mcp import StdioServerParameters

    parameters = StdioServerParameters(
        command=sys.executable,
        args=zygote.through([str(MCP_SERVER)]),
        env={"MCP_SIDE_EFFECTS": str(log), "MCP_DOWN_WHILE": str(down)},
    )
    if "tools" in TOOLS:
        TOOLS.pop("tools").close()
    made = ToolRegistry.from_mcp(
        parameters, errlog=TOOLS["errlog"], connect_timeout=5, reconnects=0, **options
    )
    TOOLS["tools"] = made
    return made


def test_an_mcp_server_that_does_not_start_is_waited_for(
    runtime: da.Runtime, inspector: Inspector, stdio_tools: tuple[Path, Path]
) -> None:
    log, down = stdio_tools
    handle = da.start(mcp_calls, [use(0, "add", a=2, b=3)])
    wid = handle.workflow_id
    wait_until(
        lambda: _waiting_for(inspector, wid, "MCP server 'mcp_server_app'"),
        60,
        "the listing to wait for its server",
    )
    assert inspector.step_names(wid) == ["mcp:list_tools:mcp_server_app"]
    assert len(effects(log, "server-down")) >= 1 and not effects(log, "server-start")
    advance_clock(30)  # still down: it tries again, and waits again
    wait_until(lambda: len(effects(log, "server-down")) >= 2, 60, "a second try")
    down.unlink()  # two minutes in, the server is back
    (result,) = until_done(handle)
    assert result["content"] == "5" and not result.get("is_error")
    assert [row[:3] for row in effects(log, "add")] == [["add", "2", "3"]]
    assert inspector.status(wid) is WorkflowStatus.SUCCESS


def test_a_non_idempotent_call_to_a_server_that_went_down_is_sent_once_it_is_back(
    runtime: da.Runtime, inspector: Inspector, stdio_tools: tuple[Path, Path]
) -> None:
    log, down = stdio_tools
    down.unlink()
    stdio_registry(log, down, tool_options={"append": {"idempotent": False}})
    handle = da.start(mcp_later, [use(0, "append", text="once")])
    wid = handle.workflow_id
    wait_until(lambda: effects(log, "server-start"), 60, "the listing")
    wait_until(
        lambda: (
            (info := inspector.workflow(wid)) is not None
            and info.status is WorkflowStatus.SUSPENDED
        ),
        60,
        "the workflow to wait for its go",
    )
    down.touch()  # the server goes down: its process is gone, and it does not start
    os.kill(int(effects(log, "server-start")[-1][-1]), 9)
    da.send(wid, "go", topic="go")
    wait_until(
        lambda: _waiting_for(inspector, wid, "MCP server 'mcp_server_app'"),
        60,
        "the call to wait for its server",
    )
    assert not effects(log, "append")
    down.unlink()
    (result,) = until_done(handle)
    assert result["content"] == "appended once"
    assert len(effects(log, "append")) == 1


def test_an_mcp_server_whose_port_is_closed_is_waited_for(
    runtime: da.Runtime, inspector: Inspector, tmp_path: Path
) -> None:
    from tests.process.test_mcp_http import start_server

    port = free_port()
    log = tmp_path / "effects.log"
    TOOLS["tools"] = ToolRegistry.from_mcp(
        f"http://127.0.0.1:{port}/mcp", connect_timeout=5, reconnects=0
    )
    server: subprocess.Popen[bytes] | None = None
    try:
        handle = da.start(mcp_calls, [use(0, "add", a=1, b=1)])
        wid = handle.workflow_id
        wait_until(
            lambda: _waiting_for(inspector, wid, "MCP server '127_0_0_1'"),
            60,
            "the listing to wait for the server",
        )
        server = start_server(port, log)
        (result,) = until_done(handle)
        assert result["content"] == "2"
        assert inspector.status(wid) is WorkflowStatus.SUCCESS
    finally:
        TOOLS.pop("tools").close()
        if server is not None:
            server.kill()
            server.wait(10)


def test_retry_on_the_command_line(
    runtime: da.Runtime, dbos_agent_database_url: str, stdio_tools: tuple[Path, Path]
) -> None:
    """``dbos-agent retry ID`` tries now; unknown, finished or not waiting: one line, 1."""
    from tests.helpers import cli, ok, refused

    log, down = stdio_tools
    stdio_registry(log, down, interval=600)  # it would wait ten minutes by itself
    handle = da.start(mcp_calls, [use(0, "add", a=4, b=4)])
    wid = handle.workflow_id
    wait_until(lambda: handle.get_info().retrying is not None, 60, "the listing to wait")
    shown = ok(cli(dbos_agent_database_url, "workflows", "show", wid))
    assert "MCP server 'mcp_server_app' since" in shown and f"retry {wid}" in shown
    listed = json.loads(ok(cli(dbos_agent_database_url, "workflows", "list", "--json")))
    [row] = [w for w in listed if w["workflow_id"] == wid]
    assert row["retrying"]["waiting_for"] == "MCP server 'mcp_server_app'"
    down.unlink()
    started = len(effects(log, "server-start"))
    assert "1 step" in ok(cli(dbos_agent_database_url, "retry", wid))
    assert handle.result(timeout=60)[0]["content"] == "8"  # no clock moved: tried at once
    assert len(effects(log, "server-start")) == started + 1
    refused(cli(dbos_agent_database_url, "retry", wid), 1, "already finished")
    refused(cli(dbos_agent_database_url, "retry", "no-such-workflow"), 1, "no-such-workflow")
    other = da.start(mcp_later, [])
    wait_until(lambda: other.get_info().status is WorkflowStatus.SUSPENDED, 60, "a recv wait")
    refused(cli(dbos_agent_database_url, "retry", other.workflow_id), 1, "not waiting for a retry")
    da.operations.cancel(other.workflow_id)
