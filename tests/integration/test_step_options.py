"""A step's options, said once (``StepOptions``): ``@da.step``, ``@tool`` and an MCP
server's tools take every one of them, with the same meaning, and refuse an unknown one
by name. The retry options are shown to take effect by counting attempts; MCP tools on a
real stdio server (tests/apps/mcp_server_app.py) that goes down after its listing.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ToolResultBlockParam, ToolUseBlock
from mcp import StdioServerParameters

import dbos_agent as da
from dbos_agent.agent import ToolOptions, ToolRegistry, tool
from dbos_agent.agent.mcp import McpConnectionError, McpOptions
from dbos_agent.errors import InvalidOptionError
from dbos_agent.testing import Inspector
from tests.helpers import new_id, per_test
from tests.support import zygote

MCP_SERVER = Path(__file__).parents[1] / "apps" / "mcp_server_app.py"
ATTEMPTS: Counter[str] = per_test(Counter())
DELAYS_ASKED: list[int] = per_test([])
CURRENT: dict[str, Any] = per_test({})


class HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _transient(error: BaseException) -> bool:
    return isinstance(error, HttpError) and error.status >= 500


@dataclasses.dataclass(frozen=True, slots=True)
class CountingPolicy(da.RetryPolicy):
    """A policy deciding its own delays (as one reading a retry-after would): each asked."""

    def backoff_delay(self, attempt: int, error: BaseException) -> float:
        DELAYS_ASKED.append(attempt)
        return 0.0


@tool(retries=4, interval=0.001, retry_on=(HttpError,), retry_if=_transient)
def fetch(key: str, statuses: list[int]) -> str:
    """Fetch a page; fails with the statuses given, one per attempt, then succeeds."""
    ATTEMPTS[key] += 1
    if ATTEMPTS[key] <= len(statuses):
        raise HttpError(statuses[ATTEMPTS[key] - 1])
    return f"ok after {ATTEMPTS[key]}"


@tool(retries=2, interval=0.001, backoff=3.0, jitter=0.0)
def steady(key: str) -> str:
    """Always fails; its waits are exact (no jitter)."""
    ATTEMPTS[key] += 1
    raise HttpError(503)


@tool(retry_policy=CountingPolicy(retries=3))
def paced(key: str) -> str:
    """Always fails; its policy decides the delays."""
    ATTEMPTS[key] += 1
    raise HttpError(503)


REGISTRY = ToolRegistry([fetch, steady, paced])


def use(n: int, name: str, **tool_input: Any) -> ToolUseBlock:
    return ToolUseBlock(type="tool_use", id=f"toolu_{n:02d}", name=name, input=tool_input)


@da.durable_workflow(name="step_options_tools")
def calls(blocks: list[ToolUseBlock]) -> list[ToolResultBlockParam]:
    return REGISTRY.call_all(blocks)


def test_every_step_option_is_a_tool_option_and_an_mcp_option() -> None:
    from dbos_agent.integrations.pydantic_ai import StepOptions as PydanticAiStepOptions

    retry_fields = {field.name for field in dataclasses.fields(da.RetryPolicy)}
    step_options = da.StepOptions.__optional_keys__
    assert step_options == retry_fields | {"retry_policy", "idempotent", "guard", "timeout"}
    assert {"retry_if", "jitter", "retry_policy", "give_up_after", "waits_for"} <= step_options
    assert ToolOptions.__optional_keys__ == step_options | {
        "name",
        "description",
        "requires_approval",
    }
    assert step_options <= McpOptions.__optional_keys__
    assert PydanticAiStepOptions is da.StepOptions


def test_a_tools_retry_if_retries_only_what_it_accepts(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    wid, key, other = new_id(), new_id("k"), new_id("k")
    with da.workflow_id(wid):
        results = calls(
            [
                use(0, "fetch", key=key, statuses=[503, 502]),
                use(1, "fetch", key=other, statuses=[503, 400]),
            ]
        )
    assert results[0]["content"] == "ok after 3"
    assert results[1].get("is_error") and results[1]["content"] == "HttpError: HTTP 400"
    assert (ATTEMPTS[key], ATTEMPTS[other]) == (3, 2)  # the 400 was not retried
    assert [step.attempts for step in inspector.steps(wid)] == [3, 2]


def test_a_tools_jitter_and_retry_policy_are_its_steps(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    policy = steady._step.__dbos_agent_step__.retry  # type: ignore[attr-defined]
    assert policy.jitter == 0.0
    assert [policy.backoff_delay(n, HttpError(503)) for n in (1, 2, 3)] == [
        0.001,
        pytest.approx(0.003),
        pytest.approx(0.009),
    ]
    assert paced._step.__dbos_agent_step__.retry == CountingPolicy(retries=3)  # type: ignore[attr-defined]

    wid, key, other = new_id(), new_id("k"), new_id("k")
    with da.workflow_id(wid):
        results = calls([use(0, "steady", key=key), use(1, "paced", key=other)])
    assert all(result.get("is_error") for result in results)
    assert (ATTEMPTS[key], ATTEMPTS[other]) == (3, 4)
    assert DELAYS_ASKED == [1, 2, 3]  # the policy itself paced the tool's retries
    assert [step.attempts for step in inspector.steps(wid)] == [3, 4]


def test_an_unknown_or_conflicting_option_is_refused_by_name() -> None:
    def plain(x: int) -> int:
        return x

    for refused, where in (
        (lambda: tool(retires=3)(plain), "tool 'plain'"),  # type: ignore[call-overload]
        (lambda: da.step(name="s", retires=3), "step 's'"),  # type: ignore[call-overload]
        (lambda: ToolRegistry.from_mcp(["srv.py"], retires=3), "MCP server 'srv'"),  # type: ignore[call-arg]
        (
            lambda: ToolRegistry.from_mcp(["srv.py"], tool_options={"add": {"retires": 3}}),  # type: ignore[typeddict-unknown-key]
            "MCP tool 'add'",
        ),
    ):
        with pytest.raises(TypeError) as refusal:
            refused()
        message = str(refusal.value)
        assert message.startswith(f"{where}: unknown options ['retires']"), message
        assert "retries" in message and "retry_if" in message and "retry_policy" in message

    with pytest.raises(
        InvalidOptionError, match=r"'tool:plain': retries= given with retry_policy="
    ):
        tool(retries=2, retry_policy=da.RetryPolicy())(plain)
    with pytest.raises(ValueError, match="jitter must be between 0 and 1"):
        tool(jitter=1.5)(plain)
    with pytest.raises(InvalidOptionError, match="timeout must be > 0"):
        tool(timeout=-1)(plain)


# --------------------------------------------------------------------------- MCP tools


@pytest.fixture
def mcp_tools(tmp_path: Path) -> Iterator[Callable[..., ToolRegistry]]:
    """Registries of a stdio server that ``CURRENT["outage"]()`` kills and keeps down."""
    log, down = tmp_path / "effects.log", tmp_path / "down"
    made: list[ToolRegistry] = []

    def make(**options: Any) -> ToolRegistry:
        down.unlink(missing_ok=True)
        parameters = StdioServerParameters(
            command=sys.executable,
            args=zygote.through([str(MCP_SERVER)]),
            env={"MCP_SIDE_EFFECTS": str(log), "MCP_DOWN_WHILE": str(down)},
        )
        made.append(ToolRegistry.from_mcp(parameters, errlog=errlog, reconnects=0, **options))
        CURRENT["tools"] = made[-1]
        return made[-1]

    def outage() -> None:
        down.touch()  # until the next registry is made
        started = [line.split() for line in log.read_text().splitlines()]
        os.kill(int([row for row in started if row[0] == "server-start"][-1][-1]), signal.SIGKILL)

    CURRENT["outage"] = outage
    with open(os.devnull, "w") as errlog:
        yield make
        for registry in made:
            registry.close()


@da.durable_workflow(name="step_options_mcp_outage")
def call_in_an_outage(block: ToolUseBlock) -> list[ToolResultBlockParam]:
    tools: ToolRegistry = CURRENT["tools"]
    tools.params()  # the listing, while the server is up
    CURRENT["outage"]()
    return tools.call_all([block])


def test_mcp_tools_take_every_step_option_and_retry_by_them(
    runtime: da.Runtime, inspector: Inspector, mcp_tools: Callable[..., ToolRegistry]
) -> None:
    options: dict[str, Any] = {
        "retries": 2,
        "interval": 0.001,
        "jitter": 0.0,
        "retry_if": _transient,
        "give_up_after": None,
        "tool_options": {"add": {"retry_policy": CountingPolicy(retries=1)}},
    }
    by_name = {item.name: item for item in mcp_tools(**options).list_tools()}
    server_wide = by_name["append"]._step.__dbos_agent_step__.retry  # type: ignore[attr-defined]
    assert (server_wide.retries, server_wide.jitter, server_wide.retry_if) == (2, 0.0, _transient)
    assert server_wide.give_up_after is None
    assert server_wide.waits_for == "MCP server 'mcp_server_app'"
    own = by_name["add"]._step.__dbos_agent_step__.retry  # type: ignore[attr-defined]
    assert own == CountingPolicy(retries=1)  # over the server's options, not merged with them

    # A server gone for good (no horizon): each call is tried as its options say, then its
    # McpConnectionError ends the run (an outage is the engine's, never the model's).
    for block, attempts in ((use(0, "add", a=1, b=2), 2), (use(0, "append", text="x"), 3)):
        mcp_tools(**options)
        wid = new_id("mcp")
        with pytest.raises(McpConnectionError), da.workflow_id(wid):
            call_in_an_outage(block)
        steps = inspector.steps(wid)
        assert [step.name for step in steps] == [
            "mcp:list_tools:mcp_server_app",
            f"tool:{block.name}",
        ]
        assert steps[1].attempts == attempts
    assert DELAYS_ASKED == [1]  # add's policy paced add's retry; append's options, its own


def test_a_retry_option_of_a_tool_adjusts_its_servers_retry_policy(
    mcp_tools: Callable[..., ToolRegistry],
) -> None:
    tools = mcp_tools(
        retry_policy=da.RetryPolicy(retries=5, interval=0.5),
        tool_options={"add": {"retries": 1}},
    )
    by_name = {item.name: item for item in tools.list_tools()}
    add = by_name["add"]._step.__dbos_agent_step__.retry  # type: ignore[attr-defined]
    append = by_name["append"]._step.__dbos_agent_step__.retry  # type: ignore[attr-defined]
    assert append == da.RetryPolicy(retries=5, interval=0.5)  # no default horizon beside it
    assert add == da.RetryPolicy(retries=1, interval=0.5)
