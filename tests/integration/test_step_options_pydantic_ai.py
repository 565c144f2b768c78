"""A Pydantic AI tool's step options (its ``{"dbos_agent": {...}}`` metadata) are
``@da.step``'s, all of them (``retry_if``, ``jitter``, ``retry_policy`` too), taking effect
as on a step (attempts counted); an unknown one is a ``UserError`` naming it. The agents
run on the scripted Messages API server, as in tests/test_pydantic_ai.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.exceptions import UserError

import dbos_agent as da
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, ScriptItem, text, tool_use
from dbos_agent.integrations.pydantic_ai import Durability
from dbos_agent.testing import Inspector
from tests.apps import pydantic_ai_app as app
from tests.helpers import new_id
from tests.integration.test_step_options import (
    ATTEMPTS,
    DELAYS_ASKED,
    CountingPolicy,
    HttpError,
    _transient,
)

FETCH = "opts__function_toolset__flaky.call_tool:fetch"
PACED = "opts__function_toolset__flaky.call_tool:paced"

flaky = FunctionToolset(id="flaky")


@flaky.tool_plain(
    metadata={
        "dbos_agent": {
            "retries": 4,
            "interval": 0.001,
            "jitter": 0.0,
            "retry_on": (HttpError,),
            "retry_if": _transient,
        }
    }
)
def fetch(key: str, statuses: list[int]) -> str:
    """Fetch a page; fails with the statuses given, one per attempt, then succeeds."""
    ATTEMPTS[key] += 1
    if ATTEMPTS[key] <= len(statuses):
        raise HttpError(statuses[ATTEMPTS[key] - 1])
    return f"ok after {ATTEMPTS[key]}"


@flaky.tool_plain(metadata={"dbos_agent": {"retry_policy": CountingPolicy(retries=2)}})
def paced(key: str) -> str:
    """Fails twice, then succeeds; its policy decides the delays."""
    ATTEMPTS[key] += 1
    if ATTEMPTS[key] <= 2:
        raise HttpError(503)
    return "paced ok"


misspelt = FunctionToolset(id="misspelt")


@misspelt.tool_plain(metadata={"dbos_agent": {"retires": 3}})
def lookup(key: str) -> str:
    """Look a key up."""
    return key


opts = Agent(app.model(), name="opts", toolsets=[flaky], capabilities=[Durability()])
typo = Agent(app.model(), name="typo", toolsets=[misspelt], capabilities=[Durability()])


@da.durable_workflow(name="step_options_pai")
async def solve(task: str) -> str:
    return (await opts.run(task)).output


@da.durable_workflow(name="step_options_pai_typo")
async def solve_typo(task: str) -> str:
    return (await typo.run(task)).output


@pytest.fixture
def serve() -> Iterator[Callable[[list[ScriptItem]], ScriptedServer]]:
    started: list[tuple[ScriptedServer, str]] = []

    def start(script: list[ScriptItem]) -> ScriptedServer:
        server = ScriptedServer(script).start()
        started.append((server, app.use_server(server.url)))
        return server

    yield start
    for server, previous in reversed(started):
        app.use_server(previous)
        server.stop()
    ATTEMPTS.clear()
    DELAYS_ASKED.clear()


def test_a_tools_metadata_takes_every_step_option(
    runtime: da.Runtime, inspector: Inspector, serve: Callable[[list[ScriptItem]], ScriptedServer]
) -> None:
    key, other = new_id("k"), new_id("k")
    serve(
        [
            Reply((tool_use("fetch", {"key": key, "statuses": [503, 502]}),)),
            Reply((tool_use("paced", {"key": other}),)),
            Reply((text("done"),)),
        ]
    )
    wid = new_id("pai")
    with da.workflow_id(wid):
        assert asyncio.run(solve("fetch")) == "done"
    attempts = {step.name: step.attempts for step in inspector.steps(wid)}
    assert (attempts[FETCH], attempts[PACED]) == (3, 3)
    assert (ATTEMPTS[key], ATTEMPTS[other]) == (3, 3)
    assert DELAYS_ASKED == [1, 2]  # the tool's own policy paced its retries


def test_a_tools_retry_if_stops_what_it_refuses(
    runtime: da.Runtime, inspector: Inspector, serve: Callable[[list[ScriptItem]], ScriptedServer]
) -> None:
    key = new_id("k")
    serve([Reply((tool_use("fetch", {"key": key, "statuses": [503, 400]}),))])
    wid = new_id("pai")
    with pytest.raises(HttpError, match="HTTP 400"), da.workflow_id(wid):
        asyncio.run(solve("fetch"))
    assert ATTEMPTS[key] == 2  # the 503 was retried, the 400 was not
    assert [step.attempts for step in inspector.steps(wid) if step.name == FETCH] == [2]


def test_an_unknown_option_in_a_tools_metadata_is_refused_by_name(
    runtime: da.Runtime, serve: Callable[[list[ScriptItem]], ScriptedServer]
) -> None:
    serve([Reply((tool_use("lookup", {"key": "a"}),)), Reply((text("done"),))])
    with pytest.raises(UserError) as refusal, da.workflow_id(new_id("pai")):
        asyncio.run(solve_typo("look"))
    message = str(refusal.value)
    assert "tool 'lookup'" in message and "unknown options ['retires']" in message
    assert "retry_if" in message and "retry_policy" in message
