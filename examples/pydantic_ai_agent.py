#!/usr/bin/env python3
"""A Pydantic AI coding agent that survives kill -9.

The same task as ``examples/coding_agent.py`` (fix a bug, run the tests, log the fix), but
the agent is a stock ``pydantic_ai.Agent`` whose tools come from an MCP server
(``examples/fs_mcp_server.py``, started over stdio). One capability makes it durable:
``Durability()`` turns each model request, MCP tool listing and tool call into a step
committed to Postgres before the run moves on, and the run sits inside a
``@da.durable_workflow``. Kill the process anywhere and run the same command again: the
recorded steps are replayed from the database (no token paid twice, no tool run again) and
the agent carries on from where it died.

    pip install -e '.[pydantic-ai]'
    python examples/pydantic_ai_agent.py --crash-after-turn 2   # killed (SIGKILL) after turn 2
    python examples/pydantic_ai_agent.py                        # continues: replays, finishes
    python examples/pydantic_ai_agent.py --task-id t2 --crash-in-tool 4   # dies in the append
    python examples/pydantic_ai_agent.py --task-id t2           # the guard sees it was done
    dbos-agent worker --app examples.pydantic_ai_agent          # or a worker continues it

With ``ANTHROPIC_API_KEY`` set it uses Claude; without it, an offline scripted model (a
local fake Messages API server shipped with dbos_agent) plays a short fix-the-bug session.
The database is ``$DBOS_AGENT_DATABASE_URL``, or an embedded Postgres under ./.dbos_agent/.

The MCP tools, and what a crash in the middle of each one means:

* ``read_file``: pure. Running it again is harmless.
* ``write_file``: naturally idempotent. The same bytes make the same file.
* ``run_bash``: not idempotent (``echo ... >> CHANGELOG.md`` twice is two lines). The agent
  marks it so in the tool's metadata (``{"dbos_agent": {"idempotent": False, "guard":
  already_appended}}``): its step records an intent before the command runs, and if a crash
  leaves the intent without a result, the guard looks at the file before anything runs
  again.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path
from typing import Any

from anthropic import AsyncAnthropic
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent, RunContext
from pydantic_ai.mcp import CallToolFunc, MCPToolset, ToolResult
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.tools import ToolDefinition

import dbos_agent as da
from dbos_agent import NotDone
from dbos_agent.agent import ReplayReport, replay_report, track_replay
from dbos_agent.agent.replay import replaying
from dbos_agent.agent.scripted_server import (
    CrashPlan,
    GuardAnswers,
    ScriptedServer,
    appended_already,
    coding_task_prompt,
    coding_task_script,
    demo_arguments,
    demo_project,
    run_demo,
)
from dbos_agent.integrations.pydantic_ai import Durability

MODEL_NAME = "claude-sonnet-4-6"
MCP_SERVER = Path(__file__).resolve().with_name("fs_mcp_server.py")

# The project the run works on: the workflow's ``workdir`` input (the guard reads it).
_WORKDIR: ContextVar[Path | None] = ContextVar("pydantic_ai_agent_workdir", default=None)


CRASH = CrashPlan()
GUARDED = GuardAnswers()  # what the guard answered, for the demo to say so


# --------------------------------------------------------------------------- the model


class Endpoint:
    """Which Messages API answers: Claude with ``ANTHROPIC_API_KEY``, else the offline
    scripted model, unless ``use`` chose another endpoint first. Resolved on the first
    run, so a worker importing this module (``dbos-agent worker --app
    examples.pydantic_ai_agent``) can run the agent too, and importing starts nothing."""

    def __init__(self) -> None:
        self.base_url: str | None = None
        self.offline: bool = not os.environ.get("ANTHROPIC_API_KEY")
        self._scripted: ScriptedServer | None = None

    def use(self, base_url: str | None, offline: bool) -> None:
        self.base_url, self.offline = base_url, offline or self.offline

    def describe(self) -> str:
        if self.base_url:
            return f"Using the Messages API at {self.base_url}"
        if not self.offline:
            return f"Using Claude ({MODEL_NAME}) through the Anthropic API"
        return (
            "No ANTHROPIC_API_KEY: using the OFFLINE SCRIPTED MODEL, a local fake Messages "
            "API whose replies are scripted (not Claude)."
        )

    def model(self) -> AnthropicModel:
        """The model; configuration, never a checkpointed input (no key in the database)."""
        if self.base_url:
            key = os.environ.get("ANTHROPIC_API_KEY") or "scripted"
            client = AsyncAnthropic(base_url=self.base_url, api_key=key)
        elif not self.offline:
            client = AsyncAnthropic()
        else:
            if self._scripted is None:  # plays the task for whichever folder the prompt names
                self._scripted = ScriptedServer(coding_task_script()).start()
            client = AsyncAnthropic(base_url=self._scripted.url, api_key="offline-scripted")
        return AnthropicModel(MODEL_NAME, provider=AnthropicProvider(anthropic_client=client))


ENDPOINT = Endpoint()


# --------------------------------------------------------------------------- the tools


def already_appended(command: str) -> object:
    """Guard of run_bash, asked after a crash left the command in doubt.

    Check-then-act: for ``echo LINE >> FILE`` it looks whether FILE already has LINE and
    then returns what the command returned the first time; anything else (e.g. running the
    tests) is safe to run again, so it answers NotDone.
    """
    if not appended_already(command, _WORKDIR.get() or Path.cwd()):
        return NotDone
    GUARDED.note(command)
    return "exit code 0\n"


#: Step options of the MCP tools that are not safe to repeat, by tool name.
STEP_OPTIONS: dict[str, dict[str, Any]] = {
    "run_bash": {"idempotent": False, "guard": already_appended},
}


async def mark_effects(ctx: RunContext[None], tools: list[ToolDefinition]) -> list[ToolDefinition]:
    """Put each MCP tool's step options in its metadata, where ``Durability`` reads them
    (an MCP server's own annotations are hints; what is at most once is the agent's call)."""
    return [
        replace(tool, metadata={**(tool.metadata or {}), "dbos_agent": STEP_OPTIONS[tool.name]})
        if tool.name in STEP_OPTIONS
        else tool
        for tool in tools
    ]


async def crash_point(
    ctx: RunContext[None], call_tool: CallToolFunc, name: str, args: dict[str, Any]
) -> ToolResult:
    """Runs each MCP call (inside its step): ``--crash-in-tool N`` dies once the tool has
    acted, before its result is checkpointed, the window a guard is for."""
    result = await call_tool(name, args)
    CRASH.check_in_tool()
    return result


@functools.cache
def coder(workdir: Path) -> Agent[None, str]:
    """The agent for one project: its MCP server is confined to that folder.

    ``Durability`` names the steps after the agent (``coder``) and the toolset (``fs``):
    ``coder__model.request``, ``coder__mcp_server__fs.get_tools``,
    ``coder__mcp_server__fs.call_tool``. The names are what a replay matches, so they stay.
    """
    server = MCPToolset[None](
        StdioTransport(sys.executable, [str(MCP_SERVER), str(workdir)], cwd=str(workdir)),
        id="fs",
        process_tool_call=crash_point,
    )
    return Agent(
        ENDPOINT.model(),
        name="coder",
        toolsets=[server.prepared(mark_effects)],
        capabilities=[Durability()],
        model_settings={"max_tokens": 2048},
    )


# --------------------------------------------------------------------------- the agent


def print_replay(report: ReplayReport) -> None:
    steps = ", ".join(f"#{seq} {name}" for seq, name in report.steps)
    cost = report.cost_saved()
    print(f"↺ continued from its log: {report.summary()}")
    print(f"  replayed steps: {steps}")
    if cost is not None:
        print(f"  that is about ${cost:.4f} not paid twice")
    print(flush=True)


def short(value: object, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show_reply(reply: ModelResponse) -> None:
    """The model's text, as it arrives in a live run."""
    if not replaying() and reply.text:
        print(reply.text, flush=True)


def show_tool_results(request: ModelRequest, reply: ModelResponse) -> None:
    """Each tool call of ``reply`` with the first line of its result (live runs only)."""
    if replaying():
        return
    results = {
        part.tool_call_id: part.model_response_str()
        for part in request.parts
        if isinstance(part, ToolReturnPart)
    }
    for call in reply.tool_calls:
        args = call.args_as_dict()
        shown = f"$ {args['command']}" if "command" in args else short(args, 120)
        first = (results.get(call.tool_call_id, "").strip().splitlines() or [""])[0]
        if GUARDED.took(str(args.get("command"))):  # the command did not run
            print(GUARDED.line(call.tool_name, shown, short(first)), flush=True)
        else:
            print(f"  ⚙ {call.tool_name}({shown}) → {short(first)}", flush=True)


@da.durable_workflow(name="pydantic_ai_coding_agent")
async def coding_agent(task: str, workdir: str) -> str:
    """The agent's run, durably: Pydantic AI drives the loop, each call of it is a step.

    Iterating the run's nodes only watches it: a model request node after the first means
    the turn before it (its reply and that reply's tool calls) is recorded.
    """
    _WORKDIR.set(Path(workdir))
    track_replay(on_done=print_replay)
    turn = 0
    reply: ModelResponse | None = None
    async with coder(Path(workdir)).iter(task) as run:
        async for node in run:
            if Agent.is_call_tools_node(node):  # its tool calls run next
                reply, CRASH.turn = node.model_response, turn
                show_reply(reply)
            elif Agent.is_model_request_node(node) and reply is not None:
                show_tool_results(node.request, reply)
                CRASH.check_after_turn(turn)
                turn += 1
    replay_report()  # a run that only replayed reports now (nothing ran live)
    assert run.result is not None
    return run.result.output


# --------------------------------------------------------------------------- running it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = demo_arguments(
        __doc__.split("\n\n")[0] if __doc__ else None,
        task_id="pydantic-ai-task-demo",
        crash_in_tool="kill -9 inside turn N's tool call, after it acted, before its result is "
        "checkpointed",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    project = demo_project(args)
    CRASH.after_turn, CRASH.in_tool = args.crash_after_turn, args.crash_in_tool
    ENDPOINT.use(args.base_url, args.offline)
    print(ENDPOINT.describe())
    # A one-shot command: it continues its own task id below, and leaves other
    # processes' workflows to them.
    with da.launch(args.database_url, recover=False, take_over=False):
        return run_demo(
            args.task_id,
            project,
            lambda: asyncio.run(coding_agent(coding_task_prompt(project), str(project))),
        )


if __name__ == "__main__":
    sys.exit(main())
