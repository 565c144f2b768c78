"""A Pydantic AI run's events as a dbos_agent durable stream (``Durability(events=...)``).

Every ``AgentStreamEvent`` of a run inside a workflow is one item of the workflow's
stream (default key ``pydantic_ai.events``): the event as Pydantic AI's own type dumps it
to JSON, ``event_kind`` included, so ``agent_event(item.value)`` types it back. Any
reader of dbos_agent streams follows it live, from any process: ``da.read_stream``,
``da.Client(url).read_stream``, ``dbos-agent stream ID KEY --follow``, the HTTP API and
the dashboard.

Where an event is written decides what a crash or a replay does to it:

* **Model events** (part start, delta and end, the final result) are produced inside the
  model request's step, and written from there as they arrive: live, tagged with the
  step's attempt. An attempt that fails or is cut off by a crash is voided by a ``reset``
  item before the next attempt's events (see :mod:`dbos_agent._engine.streams`); a
  recorded request replays without writing anything. Their copies that Pydantic AI
  replays in workflow code are not written again.
* **Everything else** (tool calls and results, deferred calls, custom events...) happens
  in workflow code and is written from there: each write is checkpointed as a step, so a
  replay writes nothing again. Its position in the log must be the same on every replay,
  whatever order concurrent tool calls finish in: a call's event reserves, as it is
  written, the position its result's event will take (calls are validated, and their
  events emitted, in reply order, before any runs), so the results' events take those
  positions however the calls finish.

Turning events on (or off) for a workflow that is already running changes its log (the
requests become ``request_stream`` steps, the writes steps of their own): it diverges.
Events a tool emits (``ctx.emit``) while other calls of the same reply run at once come
in the order they were emitted, which a replay need not repeat; keep such tools alone in
their reply (``sequential=True``) or their events out of the stream.

When a run ends, one more item says so: ``{"event_kind": "agent_run_result", "run_id":
..., "output": ...}`` (the output as JSON; ``agent_event`` gives it as an
:class:`AgentRunEnd`), Pydantic AI's ``AgentRunResultEvent`` as a reader can use it,
written from workflow code like the others. Logs recorded before this
item existed replay without it (it is behind the patch ``pydantic_ai.run_result_event``).

The stream is not closed when a run ends: a workflow may run its agent again, or write
items of its own under the key; close it with ``da.aio.close_stream(key)`` when the
workflow is done with it (readers stop anyway once the workflow has finished).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
import pydantic_core
from pydantic_ai._utils import aclose_if_supported
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.durable_exec._base import MODEL_RESPONSE_STREAM_EVENT_TYPES
from pydantic_ai.messages import AgentStreamEvent, FunctionToolCallEvent, FunctionToolResultEvent
from pydantic_ai.tools import AgentDepsT, RunContext

from ..._engine.extending import at_position, current_context, in_step
from ..._engine.patches import patched_async
from ..._engine.step import step_info
from ..._engine.streams import write_stream_async
from ...agent.accounting import MODEL_STEP_NAMES
from .backend import _Reservations, in_workflow_code

__all__ = [
    "DEFAULT_EVENTS_KEY",
    "RUN_RESULT_EVENT_KIND",
    "AgentRunEnd",
    "EventPublisher",
    "agent_event",
    "event_item",
    "events_key",
]

#: The stream key of ``Durability(events=True)``.
DEFAULT_EVENTS_KEY = "pydantic_ai.events"

#: The ``event_kind`` of the item that ends a run's events (Pydantic AI's own name for it).
RUN_RESULT_EVENT_KIND: Literal["agent_run_result"] = "agent_run_result"
#: The patch that brought that item: a run recorded before it replays without it.
_RUN_RESULT_PATCH = "pydantic_ai.run_result_event"

_EVENTS: pydantic.TypeAdapter[AgentStreamEvent] = pydantic.TypeAdapter(AgentStreamEvent)


def events_key(events: str | bool) -> str | None:
    """The stream key an ``events`` option names (None: no stream)."""
    if events is True:
        return DEFAULT_EVENTS_KEY
    if events is False or events == "":
        return None
    if not isinstance(events, str):
        raise TypeError(f"events must be a stream key or a bool, got {type(events).__name__}")
    return events


def event_item(event: AgentStreamEvent) -> Any:
    """An event as its stream item: Pydantic AI's JSON of it (``event_kind`` included);
    an event its type cannot dump (a custom payload) as plain JSON, unknowns as text."""
    try:
        return _EVENTS.dump_python(event, mode="json")
    except (pydantic_core.PydanticSerializationError, ValueError, TypeError):
        return pydantic_core.to_jsonable_python(event, fallback=repr)


@dataclass(frozen=True, slots=True)
class AgentRunEnd:
    """The item that ends a run's events: Pydantic AI's ``AgentRunResultEvent`` as the
    stream keeps it, the run's id and its output as JSON."""

    run_id: str | None
    output: Any
    event_kind: Literal["agent_run_result"] = RUN_RESULT_EVENT_KIND


def agent_event(value: Any) -> AgentStreamEvent | AgentRunEnd:
    """A stream item's value as the typed event it was (``event_item``'s inverse), or the
    :class:`AgentRunEnd` that ends a run's events."""
    if isinstance(value, dict) and value.get("event_kind") == RUN_RESULT_EVENT_KIND:
        return AgentRunEnd(run_id=value.get("run_id"), output=value.get("output"))
    return _EVENTS.validate_python(value)


def _in_model_step() -> bool:
    """Whether this is the step of a model request (not a tool's step running a sub-agent,
    whose model calls are plain calls inside it)."""
    return current_context() is not None and in_step() and step_info().name in MODEL_STEP_NAMES


class EventPublisher:
    """Writes a run's events to the workflow's stream ``key`` (see the module)."""

    def __init__(self, key: str) -> None:
        self.key = key
        #: The position each tool call's result event takes, reserved with its call's event.
        self._results = _Reservations()

    def model_stream_handler(
        self, handler: EventStreamHandler[AgentDepsT] | None
    ) -> EventStreamHandler[AgentDepsT]:
        """The handler of the live model stream inside the request's step: each event is
        written, then passed on to ``handler`` (which sees the stream it would have seen)."""

        async def publishing(
            ctx: RunContext[AgentDepsT], events: AsyncIterable[AgentStreamEvent]
        ) -> None:
            published = self._written_from_step(events)
            try:
                if handler is not None:
                    await handler(ctx, published)
            finally:
                async for _ in published:  # what a handler that returned early left
                    pass

        return publishing

    async def _written_from_step(
        self, events: AsyncIterable[AgentStreamEvent]
    ) -> AsyncIterator[AgentStreamEvent]:
        async for event in events:
            if _in_model_step():
                await write_stream_async(self.key, event_item(event))
            yield event

    async def written_from_workflow(
        self, ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]
    ) -> AsyncIterator[AgentStreamEvent]:
        """The run's event stream, each workflow-side event written (checkpointed) before
        it is passed on; the model events were written from their step."""
        try:
            async for event in events:
                if in_workflow_code() and not isinstance(event, MODEL_RESPONSE_STREAM_EVENT_TYPES):
                    await self._write_from_workflow(ctx.run_id, event)
                yield event
        finally:
            await aclose_if_supported(events)

    async def write_run_result(self, run_id: str | None, output: Any) -> None:
        """The item that ends a run's events, with its output (from workflow code)."""
        if await patched_async(_RUN_RESULT_PATCH):
            value = {
                "event_kind": RUN_RESULT_EVENT_KIND,
                "run_id": run_id,
                "output": pydantic_core.to_jsonable_python(output, fallback=repr),
            }
            await write_stream_async(self.key, value)

    async def _write_from_workflow(self, run_id: str | None, event: AgentStreamEvent) -> None:
        position = None
        if isinstance(event, FunctionToolResultEvent):
            position = self._results.take(run_id, event.tool_call_id)
        with at_position(position):
            await write_stream_async(self.key, event_item(event))
        if isinstance(event, FunctionToolCallEvent):
            self._results.reserve(run_id, event.tool_call_id)
