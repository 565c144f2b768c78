"""A replayed Pydantic AI request is answered from the log before it is prepared again.

The agents use Pydantic AI's Anthropic model over real HTTP to the scripted Messages API
server; their model counts every ``prepare_messages`` (the history mapped for the wire,
the work a replay skips). A fork from past the last step replays a whole recorded run;
its messages must be the live run's, with run ids and times aside.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, FunctionToolset, ModelRetry, RunContext
from pydantic_ai.capabilities import AbstractCapability, ProcessHistory
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart
from pydantic_ai.models import ModelRequestContext, ModelRequestParameters
from pydantic_ai.models.anthropic import AnthropicModel

import dbos_agent as da
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, ScriptItem, text, tool_use
from dbos_agent.integrations.pydantic_ai import Durability
from dbos_agent.integrations.pydantic_ai.replay import answers_from_log
from dbos_agent.testing import Inspector
from tests.apps import pydantic_ai_app as app
from tests.helpers import new_id

pytestmark = pytest.mark.usefixtures("runtime")


class Counted(AnthropicModel):
    """The app's model, counting the requests Pydantic AI prepares for the wire."""

    prepared = 0

    def prepare_messages(
        self,
        messages: list[ModelMessage],
        model_request_parameters: ModelRequestParameters | None = None,
    ) -> list[ModelMessage]:
        Counted.prepared += 1
        return super().prepare_messages(messages, model_request_parameters)


class Answer(BaseModel):
    total: int
    note: str


tools = FunctionToolset(id="replaytools")
TRIES: dict[str, int] = {}


@tools.tool_plain
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tools.tool_plain
def picky(n: int) -> int:
    """Double n; asks the model to try again the first time it is called."""
    TRIES["picky"] = TRIES.get("picky", 0) + 1
    if TRIES["picky"] == 1:
        raise ModelRetry("call me once more")
    return 2 * n


def keep_recent(messages: list[ModelMessage]) -> list[ModelMessage]:
    """A history processor: the first request and the last eleven messages (written back
    to the run's history, so a replay that skipped it would end with another one)."""
    return messages if len(messages) <= 12 else [messages[0], *messages[-11:]]


class Checked(AbstractCapability[Any]):
    """Rewrites every reply's text after the request: an attempt hook."""

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        parts = [
            replace(p, content=p.content + " (checked)") if isinstance(p, TextPart) else p
            for p in response.parts
        ]
        return replace(response, parts=parts)


def agent(name: str, *extra: AbstractCapability[Any]) -> Agent[None, Answer]:
    return Agent(
        Counted(app.MODEL_NAME, provider=app.PROVIDER),
        name=name,
        toolsets=[tools],
        output_type=Answer,
        instructions="Add things up; explain in a short note.",
        capabilities=[ProcessHistory(keep_recent), Durability(), *extra],
    )


AGENTS = {"plain": agent("replayer"), "checked": agent("replaychecked", Checked())}
MESSAGES: dict[str, list[ModelMessage]] = {}

SCRIPT: list[ScriptItem] = [
    Reply((text("first the sums"), tool_use("add", {"a": 1, "b": 2}))),
    Reply((tool_use("picky", {"n": 4}),)),
    Reply((tool_use("picky", {"n": 4}),)),
    *[Reply((tool_use("add", {"a": i, "b": i}),)) for i in range(4)],
    Reply((text("done"), tool_use("final_result", {"total": 11, "note": "summed"}))),
]


@da.durable_workflow(name="pai_replay_run")
async def run(which: str, key: str) -> dict[str, Any]:
    result = await AGENTS[which].run("add up 1+2, double 4, and more")
    MESSAGES[key] = result.all_messages()
    return result.output.model_dump()


def comparable(messages: list[ModelMessage]) -> Any:
    """The messages as JSON, without what differs between two runs of one log."""
    varying = {"timestamp", "run_id", "conversation_id", "request_timestamp", "duration"}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in varying}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(ModelMessagesTypeAdapter.dump_json(messages)))


@dataclass
class Replayed:
    live: list[ModelMessage]
    replayed: list[ModelMessage]
    prepared_live: int
    prepared_replaying: int
    requests: int


@pytest.fixture
def replay_of(inspector: Inspector) -> Iterator[Callable[[str], Replayed]]:
    servers: list[tuple[ScriptedServer, str]] = []

    def replay_of(which: str) -> Replayed:
        server = ScriptedServer(SCRIPT).start()
        servers.append((server, app.use_server(server.url)))
        TRIES.clear()
        wid = new_id(f"pai-replay-{which}")
        Counted.prepared = 0
        with da.workflow_id(wid):
            output = asyncio.run(run(which, "live"))
        assert output == {"total": 11, "note": "summed"}
        prepared_live, live = Counted.prepared, MESSAGES.pop("live")
        Counted.prepared = 0
        TRIES.clear()
        steps = inspector.steps(wid)
        fork = da.operations.fork(wid, from_step=len(steps))
        assert fork.result(timeout=60) == output
        return Replayed(
            live=live,
            replayed=MESSAGES.pop("live"),
            prepared_live=prepared_live,
            prepared_replaying=Counted.prepared,
            requests=len(server.requests),
        )

    yield replay_of
    for server, previous in reversed(servers):
        app.use_server(previous)
        server.stop()


def test_a_replayed_run_prepares_no_recorded_request_and_ends_with_the_live_history(
    replay_of: Callable[[str], Replayed],
) -> None:
    seen = replay_of("plain")
    assert seen.requests == len(SCRIPT)  # the replay sent nothing
    assert seen.prepared_live == len(SCRIPT)
    assert seen.prepared_replaying == 0  # every recorded request answered before preparing
    assert comparable(seen.replayed) == comparable(seen.live)
    # the history holds what the shortcut must not lose: the instructions recorded on
    # the requests, the retry prompt, the structured output's call, and the processor's
    # cut (the first reply is gone)
    dumped = json.dumps(comparable(seen.live))
    assert "Add things up" in dumped and "call me once more" in dumped
    assert "final_result" in dumped and "first the sums" not in dumped


def test_a_capability_acting_on_the_attempt_gets_the_replayed_request_the_long_way(
    replay_of: Callable[[str], Replayed],
) -> None:
    seen = replay_of("checked")
    assert seen.requests == len(SCRIPT)
    assert seen.prepared_replaying == len(SCRIPT)  # no shortcut: its hook sees every reply
    assert comparable(seen.replayed) == comparable(seen.live)
    assert "done (checked)" in json.dumps(comparable(seen.replayed))


def test_only_attempt_hooks_of_other_capabilities_keep_the_long_way() -> None:
    def durability_of(root: AbstractCapability[Any]) -> Durability[Any]:
        leaves: list[AbstractCapability[Any]] = []
        root.apply(leaves.append)
        (durability,) = [leaf for leaf in leaves if isinstance(leaf, Durability)]
        return durability

    plain, checked = AGENTS["plain"].root_capability, AGENTS["checked"].root_capability
    assert answers_from_log(plain, durability_of(plain))  # tool search, history processor
    assert not answers_from_log(checked, durability_of(checked))
    assert not answers_from_log(plain, Durability())  # its own hooks are another's here


big_tools = FunctionToolset(id="bigtools")


@big_tools.tool_plain
def blob(kib: int) -> str:
    """A document of ``kib`` KiB."""
    TRIES["blob"] = TRIES.get("blob", 0) + 1
    return "x" * (kib * 1024)


big = Agent(
    Counted(app.MODEL_NAME, provider=app.PROVIDER),
    name="bigpayload",
    toolsets=[big_tools],
    capabilities=[Durability()],
)


@da.durable_workflow(name="pai_replay_big")
async def read_big(kib: int) -> int:
    result = await big.run(f"read {kib} KiB")
    returned = [
        part.content
        for message in result.all_messages()
        for part in getattr(message, "parts", [])
        if getattr(part, "part_kind", "") == "tool-return"
    ]
    return len(str(returned[0]))


def test_a_tool_result_of_megabytes_is_a_step_and_replays(inspector: Inspector) -> None:
    """Beyond the ~2 MB a Temporal payload may hold: a 5 MiB tool result is one step,
    sent to the model once, and a replay hands the same 5 MiB back without the tool."""
    kib = 5 * 1024
    script: list[ScriptItem] = [Reply((tool_use("blob", {"kib": kib}),)), Reply((text("read"),))]
    server = ScriptedServer(script + script[1:]).start()
    previous = app.use_server(server.url)
    try:
        wid = new_id("pai-big")
        TRIES.clear()
        with da.workflow_id(wid):
            assert asyncio.run(read_big(kib)) == kib * 1024
        steps = inspector.steps(wid)
        assert [s.name for s in steps] == [
            "bigpayload__model.request",
            "bigpayload__function_toolset__bigtools.call_tool:blob",
            "bigpayload__model.request",
        ]
        assert len(steps[1].output["result"]) == kib * 1024
        fork = da.operations.fork(wid, from_step=2)  # the second request live again, the tool not
        assert fork.result(timeout=60) == kib * 1024
        assert len(server.requests) == 3 and TRIES["blob"] == 1
        assert len(json.dumps(server.requests[-1].body)) > kib * 1024  # sent whole
    finally:
        app.use_server(previous)
        server.stop()
