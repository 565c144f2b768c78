"""Pydantic AI agents run durably on dbos_agent, imported by the tests and run as a
subprocess that they kill -9 and run again:

    python -m tests.pydantic_ai_app WORKFLOW NAME WORKFLOW_ID [TASK]

Environment: DBOS_AGENT_DATABASE_URL; MODEL_URL (a scripted Messages API server);
SIDE_LOG (every side effect, appended with the pid, counted from outside the process:
``body start``/``body end`` around each run of a workflow body, ``add A B start|end``,
``slow I start|end``, ``sent TO``); KILL_AT=add:A makes ``add`` kill its own process
(SIGKILL) when called with ``a == A``, KILL_AT=sent after ``send`` has sent;
HANG_ODD=1 makes ``slow`` hang on odd ``i`` until the process is killed; MCP_LOG and
MCP_HANG for the MCP server (tests/pydantic_ai_mcp_server.py). The result is printed as
JSON on the last line of stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx2
from anthropic import AsyncAnthropic
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.providers.anthropic import AnthropicProvider

import dbos_agent as da
from dbos_agent.agent import Budget
from dbos_agent.integrations.pydantic_ai import Durability

MODEL_NAME = "claude-sonnet-4-6"
#: The one provider of every agent here; in-process tests point it at their server with
#: :func:`use_server`. No client retries (a request is made once or fails), and no kept-alive
#: connections: runs on different event loops (``asyncio.run``, ``run_sync``, the engine's
#: loop) share the client, and a connection opened on one loop cannot be read on another.
PROVIDER = AnthropicProvider(
    anthropic_client=AsyncAnthropic(
        base_url=os.environ.get("MODEL_URL", "http://127.0.0.1:9"),
        api_key="x",
        max_retries=0,
        http_client=httpx2.AsyncClient(limits=httpx2.Limits(max_keepalive_connections=0)),
    )
)


def use_server(url: str) -> str:
    """Point every agent here at ``url``; returns the URL they used before."""
    previous = str(PROVIDER.client.base_url)
    PROVIDER.client.base_url = url
    return previous


def side_log() -> Path:
    return Path(os.environ.get("SIDE_LOG", "side.log"))


def note(line: str) -> None:
    with side_log().open("a", encoding="utf-8") as log:
        log.write(f"{line} {os.getpid()}\n")


def model() -> AnthropicModel:
    """The Anthropic model on the scripted server."""
    return AnthropicModel(MODEL_NAME, provider=PROVIDER)


math = FunctionToolset(id="math")


@math.tool_plain
def add(a: int, b: int) -> int:
    """Add two integers."""
    note(f"add {a} {b} start")
    if os.environ.get("KILL_AT") == f"add:{a}":
        os.kill(os.getpid(), signal.SIGKILL)
    note(f"add {a} {b} end")
    return a + b


@math.tool_plain
async def slow(i: int) -> int:
    """Work on part i (odd parts hang with HANG_ODD=1; later parts finish first)."""
    note(f"slow {i} start")
    if i % 2 and os.environ.get("HANG_ODD"):
        await asyncio.sleep(3600)  # killed -9 here
    await asyncio.sleep(0.05 * (4 - i))
    note(f"slow {i} end")
    return i * 10


def already_sent(to: str) -> str | object:
    """The guard of ``send``: the earlier result if the mail went out, else NotDone."""
    if side_log().exists() and f"sent {to} " in side_log().read_text():
        return f"sent to {to}"
    return da.NotDone


@math.tool_plain(metadata={"dbos_agent": {"idempotent": False, "guard": already_sent}})
def send(to: str) -> str:
    """Send the answer to someone (not idempotent: at most once)."""
    note(f"sent {to}")
    if os.environ.get("KILL_AT") == "sent":
        os.kill(os.getpid(), signal.SIGKILL)
    return f"sent to {to}"


calc = Agent(model(), name="calc", toolsets=[math], capabilities=[Durability()])
#: The budget of the family of ``budgeted``: the parent's call fits, the child's does not.
BUDGET = Budget(max_tokens=6000)
budgeted_calc = Agent(
    model(), name="budgeted", toolsets=[math], capabilities=[Durability(budget=BUDGET)]
)


def mcp_toolset() -> MCPToolset[Any]:
    server = Path(__file__).with_name("pydantic_ai_mcp_server.py")
    env = {k: v for k, v in os.environ.items() if k in ("MCP_LOG", "MCP_HANG", "PATH")}
    return MCPToolset(StdioTransport(sys.executable, [str(server)], env=env), id="calc")


mcp_calc = Agent(model(), name="mcpcalc", toolsets=[mcp_toolset()], capabilities=[Durability()])


@da.durable_workflow(name="pai_solve")
async def solve(task: str) -> str:
    note("body start")
    result = await calc.run(task)
    note("body end")
    return result.output


@da.durable_workflow(name="pai_solve_sync")
def solve_sync(task: str) -> str:
    note("body start")
    result = calc.run_sync(task)
    note("body end")
    return result.output


@da.durable_workflow(name="pai_solve_mcp")
async def solve_mcp(task: str) -> str:
    note("body start")
    result = await mcp_calc.run(task)
    note("body end")
    return result.output


@da.durable_workflow(name="pai_budget_child")
async def budget_child(task: str) -> str:
    return (await budgeted_calc.run(task)).output


@da.durable_workflow(name="pai_budget_parent")
async def budget_parent(task: str) -> list[str]:
    first = (await budgeted_calc.run(task)).output
    handle = da.start(budget_child, task)
    try:
        second = await handle.result_async()
    except da.DbosAgentError as refused:
        second = f"{type(refused).__name__}: {refused}"
    return [first, second]


WORKFLOWS = {
    "solve": solve,
    "solve_sync": solve_sync,
    "solve_mcp": solve_mcp,
    "budget_parent": budget_parent,
}


def main() -> int:
    name, workflow_id = sys.argv[1], sys.argv[2]
    task = sys.argv[3] if len(sys.argv) > 3 else "compute"
    with da.launch(os.environ["DBOS_AGENT_DATABASE_URL"], executor_id="pydantic-ai-app"):
        handle = da.start(WORKFLOWS[name], task, workflow_id=workflow_id)
        print(json.dumps(handle.result(timeout=60)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
