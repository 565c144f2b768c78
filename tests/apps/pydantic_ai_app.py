"""Pydantic AI agents run durably on dbos_agent, imported by the tests and run as a
subprocess that they kill -9 and run again:

    python -m tests.apps.pydantic_ai_app WORKFLOW_ID=WORKFLOW:TASK ...

starts (or, run again, continues) each workflow under its id, all at once, and prints
``{workflow id: result}`` as JSON on the last line of stdout.

Environment: DBOS_AGENT_DATABASE_URL; MODEL_URL (a scripted Messages API server);
SIDE_LOG (every side effect, appended with the pid, counted from outside the process:
``TASK body start``/``TASK body end`` around each run of a workflow body, ``add A B
start|end``, ``slow I start|end``, ``sent TO``); HANG_AT (comma-separated) makes tools
hang until the process is killed: ``add:A`` in ``add`` called with ``a == A``, ``sent``
in ``send`` once it has sent, ``slow:odd`` in ``slow`` on odd ``i``; MCP_LOG and MCP_HANG
for the MCP server (tests/apps/pydantic_ai_mcp_server.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import threading
from pathlib import Path

import httpx2
from anthropic import AsyncAnthropic
from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.providers.anthropic import AnthropicProvider

import dbos_agent as da
from dbos_agent.agent import Budget
from dbos_agent.integrations.pydantic_ai import Durability
from tests.support import zygote

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


def hangs_at(point: str) -> bool:
    return point in os.environ.get("HANG_AT", "").split(",")


def hang() -> None:
    """Wait here until the process is killed (-9)."""
    threading.Event().wait()


def model() -> AnthropicModel:
    """The Anthropic model on the scripted server."""
    return AnthropicModel(MODEL_NAME, provider=PROVIDER)


math = FunctionToolset(id="math")


@math.tool_plain
def add(a: int, b: int) -> int:
    """Add two integers."""
    note(f"add {a} {b} start")
    if hangs_at(f"add:{a}"):
        hang()
    note(f"add {a} {b} end")
    return a + b


@math.tool_plain
async def slow(i: int) -> int:
    """Work on part i (later parts finish first)."""
    note(f"slow {i} start")
    if i % 2 and hangs_at("slow:odd"):
        await asyncio.Event().wait()
    if i == 1 and hangs_at("slow:1-after-2"):  # the order, whatever the machine's load
        while "slow 2 end" not in side_log().read_text():
            await asyncio.sleep(0.01)
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
    if hangs_at("sent"):
        hang()
    return f"sent to {to}"


calc = Agent(model(), name="calc", toolsets=[math], capabilities=[Durability()])
#: The budget of the family of ``budget_parent``: a call may write 1,000 tokens; the
#: parent's call fits, and once it spent 2,600 the child's does not.
BUDGET = Budget(max_tokens=3000)
budgeted_calc = Agent(
    model(),
    name="budgeted",
    model_settings={"max_tokens": 1000},
    capabilities=[Durability(budget=BUDGET)],
)


#: Delegation: ``boss`` has the family's budget and a tool that runs ``helper`` (which has
#: none) in the workflow's own code; ``stepped_boss``'s tool runs it inside its step.
helper = Agent(
    model(), name="helper", model_settings={"max_tokens": 1000}, capabilities=[Durability()]
)
boss = Agent(
    model(),
    name="boss",
    model_settings={"max_tokens": 1000},
    capabilities=[Durability(budget=BUDGET)],
)
stepped_boss = Agent(
    model(),
    name="stepboss",
    model_settings={"max_tokens": 1000},
    capabilities=[Durability(budget=BUDGET)],
)


@boss.tool(metadata={"dbos_agent": False})
async def ask_helper(ctx: RunContext[object], question: str) -> str:
    """Ask the helper agent (in the workflow's code: its requests are steps)."""
    return (await helper.run(question, usage=ctx.usage)).output


@stepped_boss.tool
async def ask_helper_in_step(ctx: RunContext[object], question: str) -> str:
    """Ask the helper agent from inside this tool's step."""
    return (await helper.run(question, usage=ctx.usage)).output


@functools.cache
def mcp_agent() -> Agent[None, str]:
    """The agent whose tools are the MCP server's (made on first use: only the MCP
    workflow pays for importing the MCP client)."""
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    server = Path(__file__).with_name("pydantic_ai_mcp_server.py")
    env = {k: v for k, v in os.environ.items() if k in ("MCP_LOG", "MCP_HANG", "PATH")}
    env["MCP_AGENT_PID"] = str(os.getpid())  # the server's parent may be the tests' zygote
    # a first start on a loaded machine may take more than the 5 s Pydantic AI allows by
    # default: here that would be an outage waited out, and this body would run twice
    toolset = MCPToolset[None](
        StdioTransport(sys.executable, zygote.through([str(server)], start=False), env=env),
        id="calc",
        init_timeout=60,
    )
    return Agent(model(), name="mcpcalc", toolsets=[toolset], capabilities=[Durability()])


@da.durable_workflow(name="pai_solve")
async def solve(task: str) -> str:
    note(f"{task} body start")
    result = await calc.run(task)
    note(f"{task} body end")
    return result.output


@da.durable_workflow(name="pai_solve_sync")
def solve_sync(task: str) -> str:
    note(f"{task} body start")
    result = calc.run_sync(task)
    note(f"{task} body end")
    return result.output


@da.durable_workflow(name="pai_solve_mcp")
async def solve_mcp(task: str) -> str:
    note(f"{task} body start")
    result = await mcp_agent().run(task)
    note(f"{task} body end")
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


@da.durable_workflow(name="pai_delegate")
async def delegate(task: str) -> str:
    return (await boss.run(task)).output


@da.durable_workflow(name="pai_delegate_in_step")
async def delegate_in_step(task: str) -> str:
    return (await stepped_boss.run(task)).output


WORKFLOWS = {
    "solve": solve,
    "solve_sync": solve_sync,
    "solve_mcp": solve_mcp,
    "budget_parent": budget_parent,
}


def main() -> int:
    runs = [arg.partition("=") for arg in sys.argv[1:]]
    with da.launch(os.environ["DBOS_AGENT_DATABASE_URL"], executor_id="pydantic-ai-app"):
        handles = {}
        for workflow_id, _, call in runs:
            name, _, task = call.partition(":")
            handles[workflow_id] = da.start(WORKFLOWS[name], task, workflow_id=workflow_id)
        results = {wid: handle.result(timeout=60) for wid, handle in handles.items()}
        print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
