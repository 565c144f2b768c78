"""A tool result too large to record is the model's problem, not the workflow's: it is
recorded as the call's error, once, and reaches the model as an error result it can read
(plain tools, MCP tools, Pydantic AI tools); an MCP result is recorded once, not its text
twice; an MCP answer over what the client reads is an error result, sent once. The
checkpoint limit is lowered to 1 MiB here so that the values stay small."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import MessageParam, ToolResultBlockParam, ToolUseBlock

import dbos_agent as da
from dbos_agent.agent import Model, ToolRegistry, tool
from dbos_agent.agent.mcp import McpHttpServer
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, text, tool_use
from dbos_agent.testing import Inspector
from tests.helpers import new_id
from tests.process.test_mcp_tools import effects, use
from tests.support import zygote
from tests.support.web import free_port

LIMIT = 2**20
MCP_SERVER = Path(__file__).parents[1] / "apps" / "mcp_server_app.py"
CURRENT: dict[str, Any] = {}


@pytest.fixture
def small_limit(dbos_agent_database_url: str, executor_id: str) -> Iterator[da.Runtime]:
    with da.launch(
        dbos_agent_database_url, executor_id=executor_id, workers=4, max_checkpoint_bytes=LIMIT
    ) as rt:
        yield rt
    CURRENT.clear()


@tool
def dump(n: int) -> str:
    """n bytes of text."""
    return "y" * n


@da.durable_workflow(name="large_agent")
def agent(task: str) -> str:
    model: Model = CURRENT["model"]
    tools: ToolRegistry = CURRENT["tools"]
    messages: list[MessageParam] = [{"role": "user", "content": task}]
    while True:
        reply = model.create(messages)
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            return "".join(block.text for block in reply.content if block.type == "text")
        messages.append({"role": "user", "content": tools.call_all(reply.content)})


def _model(server: ScriptedServer) -> Model:
    import anthropic

    return Model(anthropic.Anthropic(base_url=server.url, api_key="x"), retries=0)


def test_a_plain_tool_result_too_large_is_an_error_result_for_the_model(
    small_limit: da.Runtime, inspector: Inspector
) -> None:
    script = [Reply((tool_use("dump", {"n": LIMIT + 100}),)), Reply((text("I will ask less"),))]
    with ScriptedServer(script) as server:
        CURRENT.update(model=_model(server), tools=ToolRegistry([dump]))
        wid = new_id("large")
        assert da.start(agent, "dump it", workflow_id=wid).result(timeout=60) == "I will ask less"
        [result] = server.requests[1].body["messages"][-1]["content"]
    assert result["is_error"] is True
    assert "MiB of JSON, over the 1.0 MiB a recorded result may be" in result["content"]
    step = inspector.steps(wid)[1]
    assert (step.name, step.status) == ("tool:dump", "ERROR")
    assert (step.error or {})["type"].endswith("CheckpointTooLargeError")


@pytest.fixture
def stdio_registry(tmp_path: Path) -> Iterator[tuple[ToolRegistry, Path]]:
    from mcp import StdioServerParameters

    log = tmp_path / "effects.log"
    parameters = StdioServerParameters(
        command=sys.executable,
        args=zygote.through([str(MCP_SERVER)]),
        env={"MCP_SIDE_EFFECTS": str(log)},
    )
    registry = ToolRegistry.from_mcp(parameters)
    yield registry, log
    registry.close()


@da.durable_workflow(name="large_mcp_calls")
async def mcp_calls(blocks: list[ToolUseBlock]) -> list[ToolResultBlockParam]:
    tools: ToolRegistry = CURRENT["tools"]
    return await tools.call_all_async(blocks)


def test_an_mcp_result_is_recorded_once(
    small_limit: da.Runtime, inspector: Inspector, stdio_registry: tuple[ToolRegistry, Path]
) -> None:
    """0.9 MiB of text, which the server also sends as structured content: recorded once
    it fits the 1 MiB limit (twice, it would not)."""
    registry, log = stdio_registry
    CURRENT["tools"] = registry
    n = 9 * LIMIT // 10
    handle = da.start(mcp_calls, [use(0, "big", size=n), use(1, "big", size=LIMIT + 10)])
    fits, too_large = handle.result(timeout=60)
    assert fits["content"] == "x" * n and not fits.get("is_error")
    assert too_large["is_error"] and "over the 1.0 MiB" in str(too_large["content"])
    recorded = inspector.steps(handle.workflow_id)[1].output
    assert recorded.get("structuredContent") is None and len(recorded["content"][0]["text"]) == n
    assert len(effects(log, "big")) == 2


def test_an_mcp_answer_over_what_the_client_reads_is_an_error_result_sent_once(
    runtime: da.Runtime, tmp_path: Path
) -> None:
    from tests.process.test_mcp_http import start_server

    port = free_port()
    log = tmp_path / "effects.log"
    server = start_server(port, log)
    url = f"http://127.0.0.1:{port}/mcp"
    limited = ToolRegistry.from_mcp(McpHttpServer(url, max_message_bytes=256 * 1024))
    default = ToolRegistry.from_mcp(url)  # reads what a step can record (not 1 MiB)
    try:
        CURRENT["tools"] = limited
        (refused,) = da.start(mcp_calls, [use(0, "big", size=512 * 1024)]).result(timeout=60)
        assert refused["is_error"] and "larger than this client reads" in str(refused["content"])
        assert len(effects(log, "big")) == 1  # not sent again: it would fail again
        CURRENT["tools"] = default
        (got,) = da.start(mcp_calls, [use(0, "big", size=2 * 2**20)]).result(timeout=60)
        assert len(str(got["content"])) == 2 * 2**20 and not got.get("is_error")
    finally:
        for registry in (limited, default):
            registry.close()
        server.kill()
        server.wait(10)


def test_a_bad_max_message_bytes_is_refused_by_name() -> None:
    for bad in (0, -1, 1.5, "1MB", True):
        with pytest.raises(da.errors.InvalidOptionError, match="max_message_bytes"):
            McpHttpServer("http://127.0.0.1:1/mcp", max_message_bytes=bad)  # type: ignore[arg-type]


PAI: dict[str, Any] = {}


@da.durable_workflow(name="large_pai")
async def pai_dump(task: str) -> str:
    return str((await PAI["agent"].run(task)).output)


def test_a_pydantic_ai_tool_result_too_large_goes_back_to_the_model(
    small_limit: da.Runtime, inspector: Inspector
) -> None:
    from pydantic_ai import Agent

    from dbos_agent.integrations.pydantic_ai import Durability
    from tests.apps import pydantic_ai_app as app

    agent = Agent(app.model(), name="dumper", capabilities=[Durability()])

    @agent.tool_plain
    def dump_text(size: int) -> str:
        """``size`` bytes of text."""
        return "z" * size

    PAI["agent"] = agent
    script = [Reply((tool_use("dump_text", {"size": LIMIT + 10}),)), Reply((text("less, then"),))]
    with ScriptedServer(script) as server:
        previous = app.use_server(server.url)
        try:
            handle = da.start(pai_dump, "dump it")
            assert handle.result(timeout=60) == "less, then"
        finally:
            app.use_server(previous)
        told = server.requests[1].body["messages"][-1]["content"][0]
    assert told["type"] == "tool_result" and "over the 1.0 MiB" in str(told["content"])
    steps = inspector.steps(handle.workflow_id)
    assert [s.status for s in steps if "dump_text" in s.name] == ["ERROR"]
