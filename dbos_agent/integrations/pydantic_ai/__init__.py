"""Pydantic AI agents made durable on dbos_agent (the ``[pydantic-ai]`` extra).

::

    import dbos_agent as da
    from pydantic_ai import Agent
    from dbos_agent.integrations.pydantic_ai import Durability

    agent = Agent("anthropic:claude-sonnet-4-5", name="calc", capabilities=[Durability()])

    @da.durable_workflow
    async def answer(question: str) -> str:
        return (await agent.run(question)).output   # each model and tool call a step

The installed Pydantic AI is checked first, before any of its internals are imported:
the integration builds on its durable-execution backend interface, which changes between
minor releases, so an untested release raises :class:`UnsupportedPydanticAIVersionError`.
"""

from __future__ import annotations

from .versions import (
    SUPPORTED,
    UnsupportedPydanticAIVersionError,
    check_version,
    installed_version,
)

check_version(installed_version())

from .backend import (  # noqa: E402  (after the version check, by design)
    DbosAgentOperationBackend,
    RecordedModelError,
    StepOptions,
)
from .capability import Durability, is_pydantic_ai_tool_step  # noqa: E402
from .events import DEFAULT_EVENTS_KEY, AgentRunEnd, agent_event, event_item  # noqa: E402

__all__ = [
    "DEFAULT_EVENTS_KEY",
    "SUPPORTED",
    "AgentRunEnd",
    "DbosAgentOperationBackend",
    "Durability",
    "RecordedModelError",
    "StepOptions",
    "UnsupportedPydanticAIVersionError",
    "agent_event",
    "check_version",
    "event_item",
    "installed_version",
    "is_pydantic_ai_tool_step",
]
