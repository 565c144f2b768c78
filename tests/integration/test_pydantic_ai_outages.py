"""A Pydantic AI run waits out its model provider and its MCP servers being down, as the
hand-written agent layer does: the request or the MCP step waits SUSPENDED for its next
attempt, saying what it waits for, and the run goes on once they are back; nothing is
paid or done twice. Outages are made with the database clock."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent, RunContext
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.tools import ToolDefinition

import dbos_agent as da
from dbos_agent.agent.scripted_server import Fail, Reply, text, tool_use
from dbos_agent.integrations.pydantic_ai import Durability
from dbos_agent.integrations.pydantic_ai.outages import (
    mcp_connect_failed,
    mcp_error_is_transient,
    model_error_is_transient,
)
from dbos_agent.records import StepStatus, WorkflowStatus
from dbos_agent.testing import Inspector
from tests.apps import pydantic_ai_app as app
from tests.helpers import until_done, wait_until
from tests.process.test_pydantic_ai import serve, side_log

__all__ = ["serve", "side_log"]  # the fixtures this module uses

MCP_SERVER = Path(__file__).parents[1] / "apps" / "pydantic_ai_mcp_server.py"
MODEL_STEP = "calc__model.request"


def test_an_overloaded_provider_is_waited_out(
    runtime: da.Runtime, inspector: Inspector, serve: Any, side_log: Path
) -> None:
    server = serve(
        [
            Fail(529),
            Fail(529),
            Fail(503),
            Reply((tool_use("add", {"a": 1, "b": 2}),)),
            Reply((text("the answer is 3"),)),
        ]
    )
    handle = da.start(app.solve, "compute")
    wait_until(lambda: handle.get_info().retrying is not None, 60, "the request to wait")
    info = handle.get_info()
    assert info.retrying is not None
    assert (info.retrying.step, info.retrying.waiting_for) == (MODEL_STEP, "the model API")
    assert until_done(handle) == "the answer is 3"
    first = inspector.steps(handle.workflow_id)[0]
    assert (first.name, first.status, first.attempts) == (MODEL_STEP, StepStatus.SUCCESS, 4)
    assert server.paid_calls == 2 and len(server.requests) == 5


AGENTS: dict[str, Agent[None, str]] = {}


@da.durable_workflow(name="pai_outage_mcp")
async def solve_with_mcp(task: str) -> str:
    return (await AGENTS["mcp"].run(task)).output


def test_an_mcp_server_that_does_not_start_is_waited_for(
    runtime: da.Runtime, inspector: Inspector, serve: Any, tmp_path: Path
) -> None:
    log, down = tmp_path / "mcp.log", tmp_path / "down"
    down.touch()
    env = {"MCP_LOG": str(log), "MCP_DOWN_WHILE": str(down), "PATH": os.environ["PATH"]}
    toolset = MCPToolset[None](
        StdioTransport(sys.executable, [str(MCP_SERVER)], env=env), id="calc"
    )
    AGENTS["mcp"] = Agent(
        app.model(), name="mcpdown", toolsets=[toolset], capabilities=[Durability()]
    )
    server = serve([Reply((tool_use("multiply", {"a": 6, "b": 7}),)), Reply((text("it is 42"),))])
    handle = da.start(solve_with_mcp, "multiply")
    wait_until(lambda: handle.get_info().retrying is not None, 60, "discovery to wait")
    info = handle.get_info()
    assert info.retrying is not None and info.retrying.waiting_for == "MCP server 'calc'"
    assert info.status is WorkflowStatus.SUSPENDED
    down.unlink()
    assert until_done(handle) == "it is 42"
    assert log.read_text().split()[:3] == ["multiply", "6", "7"]
    assert server.paid_calls == 2
    assert all(step.status is StepStatus.SUCCESS for step in inspector.steps(handle.workflow_id))


async def _not_idempotent(
    ctx: RunContext[None], tools: list[ToolDefinition]
) -> list[ToolDefinition]:
    """Every tool of the server a non-idempotent step (in its metadata, as an agent says it)."""
    marked = {"dbos_agent": {"idempotent": False}}
    return [replace(tool, metadata={**(tool.metadata or {}), **marked}) for tool in tools]


def test_a_non_idempotent_call_waits_for_a_server_it_cannot_connect_to(
    runtime: da.Runtime, inspector: Inspector, serve: Any, tmp_path: Path
) -> None:
    """A run that continues a log (after a crash; here a fork, which replays the same way in
    this process) has nothing connected: its first live MCP call connects first. A server
    that does not start then fails the call before its request is sent, so even a
    non-idempotent call waits for it (SUSPENDED, saying so) and is sent once it is back:
    the outage never becomes the workflow's error (seen under load: a handshake timing out)."""
    log, down = tmp_path / "mcp.log", tmp_path / "down"
    env = {"MCP_LOG": str(log), "MCP_DOWN_WHILE": str(down), "PATH": os.environ["PATH"]}

    def agent() -> Agent[None, str]:
        """The agent as a new process builds it: its MCP server not connected yet."""
        toolset = MCPToolset[None](
            StdioTransport(sys.executable, [str(MCP_SERVER)], env=env), id="calc"
        )
        return Agent(
            app.model(),
            name="mcponce",
            toolsets=[toolset.prepared(_not_idempotent)],
            capabilities=[Durability()],
        )

    AGENTS["mcp"] = agent()
    server = serve(
        [
            Reply((tool_use("multiply", {"a": 6, "b": 7}),)),
            Reply((text("it is 42"),)),
            Reply((text("still 42"),)),
        ]
    )
    first = da.start(solve_with_mcp, "multiply")
    assert until_done(first) == "it is 42"
    [call] = [s.seq for s in inspector.steps(first.workflow_id) if s.name.endswith(".call_tool")]

    down.touch()
    AGENTS["mcp"] = agent()  # the first one's server process still runs, connected
    again = da.operations.fork(first.workflow_id, call)
    waiting = (WorkflowStatus.PENDING, WorkflowStatus.SUSPENDED)
    wait_until(
        lambda: (found := again.get_info()).retrying is not None or found.status not in waiting,
        60,
        "the call to wait",
    )
    info = again.get_info()
    assert info.status in waiting, info.error
    assert info.retrying is not None and info.retrying.waiting_for == "MCP server 'calc'"
    assert info.retrying.step.endswith(".call_tool")
    assert log.read_text().split()[:3] == ["multiply", "6", "7"]
    assert len(log.read_text().splitlines()) == 1  # the first run's call alone: none sent
    down.unlink()
    assert until_done(again) == "still 42"
    assert [line.split()[:3] for line in log.read_text().splitlines()] == [
        ["multiply", "6", "7"]
    ] * 2
    step = inspector.steps(again.workflow_id)[call]
    assert step.status is StepStatus.SUCCESS and step.attempts >= 2, step
    assert server.paid_calls == 3


def test_which_mcp_failures_a_non_idempotent_call_waits_out() -> None:
    """Only a connection failure raised while the MCP client connects (inside Pydantic AI's
    ``MCPServer.__aenter__``, before a request is sent); not the same failure raised
    later (the request may have reached the server), nor a server's own error."""

    namespace: dict[str, Any] = {"__name__": "pydantic_ai.mcp"}
    exec(  # a method of that name in that module, as the client's
        "class Server:\n    async def __aenter__(self, error):\n        raise error\n",
        namespace,
    )

    def raised(error: BaseException, *, connecting: bool) -> BaseException:
        async def call() -> None:
            if connecting:
                await namespace["Server"]().__aenter__(error)
            raise error

        try:
            asyncio.run(call())
        except BaseException as caught:  # what a step's attempt catches
            return caught
        raise AssertionError("not raised")

    handshake = RuntimeError("Client failed to connect")
    handshake.__cause__ = TimeoutError()
    assert mcp_connect_failed(raised(handshake, connecting=True))
    assert mcp_connect_failed(raised(ConnectionRefusedError(), connecting=True))
    assert not mcp_connect_failed(raised(TimeoutError(), connecting=False))
    assert not mcp_connect_failed(raised(ValueError("bad arguments"), connecting=True))
    assert mcp_error_is_transient(raised(TimeoutError(), connecting=False))


def test_which_model_errors_are_waited_out() -> None:
    from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError

    def http(status: int, **headers: str) -> ModelHTTPError:
        return ModelHTTPError(status, "m", headers=headers or None)

    assert all(model_error_is_transient(http(s)) for s in (408, 409, 429, 500, 503, 529))
    assert not any(model_error_is_transient(http(s)) for s in (400, 401, 403, 404, 413))
    assert not model_error_is_transient(http(503, **{"x-should-retry": "false"}))
    assert not model_error_is_transient(ModelAPIError("m", "something else"))
