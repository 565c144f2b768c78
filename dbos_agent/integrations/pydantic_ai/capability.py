"""``Durability``: the capability that makes a Pydantic AI agent durable on dbos_agent.

Give it to the agent (``Agent(model, name="calc", capabilities=[Durability()])``) and call
``agent.run(...)`` (or ``run_sync``) inside a ``@da.durable_workflow``: each model request,
tool call (function tools included, no decorator needed) and MCP exchange is a step, so a
workflow killed half-way continues from its last recorded call, paying for no reply twice
and repeating no tool that finished. Outside a workflow the agent runs as it always did.

It is Pydantic AI's own contract for durable engines (``BaseDurabilityCapability``, as
``DBOSDurability`` and ``TemporalDurability`` are): Pydantic AI decides what is an
operation and what it is named; this module says how dbos_agent runs one
(:mod:`.backend`), how it numbers a run's concurrent tool calls, waits durably, and which
of its errors mean cancelled or diverged.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import anyio
from pydantic_ai._utils import aclose_if_supported
from pydantic_ai.agent import AgentRunResult, EventStreamHandler
from pydantic_ai.agent.abstract import AbstractAgent
from pydantic_ai.capabilities.abstract import WrapModelRequestHandler, WrapRunHandler
from pydantic_ai.durable_exec._base import BaseDurabilityCapability, conversation_id_from_run_id
from pydantic_ai.durable_exec._codec import JSON_CODEC
from pydantic_ai.durable_exec._operation import ToolsetCallToolId, ToolsetKind
from pydantic_ai.durable_exec._spec import DurabilityEngineSpec
from pydantic_ai.exceptions import SkipModelRequest
from pydantic_ai.messages import AgentStreamEvent, ModelResponse, ToolCallPart
from pydantic_ai.models import Model, ModelRequestContext
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolDefinition,
)

from ..._engine.extending import WorkflowContext, current_context, in_step
from ..._engine.timers import sleep_async
from ...agent.accounting import register_tool_step_recogniser
from ...agent.budget import Budget, BudgetGuard
from ...errors import SerializationError, WorkflowCancelledError, WorkflowDivergedError
from .approvals import decide_approvals
from .backend import (
    DEFAULT_MAX_TOKENS,
    METADATA_KEY,
    DbosAgentOperationBackend,
    DbosAgentOperationConfig,
    StepOptions,
    in_workflow_code,
)
from .delegation import budget_in_force, guard_for, refuse_unrecorded_call
from .events import EventPublisher, events_key
from .replay import answers_from_log

__all__ = ["Durability", "is_pydantic_ai_tool_step"]

#: What Pydantic AI's journal namer puts in the name of a tool call's operation.
_TOOL_CALL_MARKERS = ("_toolset__", "__mcp_server__")


def is_pydantic_ai_tool_step(name: str) -> bool:
    """Whether a step of this name is a Pydantic AI tool call (function, dynamic or MCP)."""
    head, dot, operation = name.partition(".")
    return (
        bool(dot)
        and operation.split(":", 1)[0] == "call_tool"
        and any(marker in head for marker in _TOOL_CALL_MARKERS)
    )


#: The recorded outcomes of a tool call that did not run: it asked for an approval, or
#: was deferred to be run elsewhere (``CallToolResult`` kinds).
_DEFERRALS = frozenset({"approval_required", "call_deferred"})


def is_pydantic_ai_deferral(output: Any) -> bool:
    """Whether a tool step's recorded output is a deferral, not the tool's result."""
    return isinstance(output, Mapping) and output.get("kind") in _DEFERRALS


register_tool_step_recogniser(is_pydantic_ai_tool_step, deferred=is_pydantic_ai_deferral)


def _not_serializable(error: Exception) -> BaseException:
    """A value Pydantic AI cannot reduce to JSON never will be: not a retryable failure."""
    return SerializationError(f"a Pydantic AI value cannot be recorded as JSON: {error}")


#: Agent runs that drew a default ``run_id`` at each step position, per workflow run.
_runs_at: weakref.WeakKeyDictionary[WorkflowContext, dict[int, int]] = weakref.WeakKeyDictionary()


@dataclass(init=False, kw_only=True)
class Durability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent's runs durable inside a dbos_agent workflow.

    Args:
        models: Other models the run may switch to, by id (see Pydantic AI's
            ``DBOSDurability``: a model instance cannot cross a step, a registered id can).
        event_stream_handler: Pydantic AI's event stream handler; model events reach it
            live inside the model step (not again on replay).
        name: The name in the step names (default: the agent's ``name``). Step names are
            compatibility data: renaming the agent strands its unfinished workflows.
        budget: Tokens and dollars the workflow's family may spend on model calls, counted
            from the log (:class:`dbos_agent.agent.Budget`); a refused call raises
            ``BudgetExceededError`` (or waits for a raise, ``wait_for_raise=True``).
        model_step: Step options of model requests (retries, timeout...).
        tool_step: Step options of function tool calls; a tool's metadata
            ``{"dbos_agent": {...}}`` overrides them for that tool, e.g.
            ``{"idempotent": False, "guard": already_sent}``, or ``False`` for no step.
        mcp_step: Step options of MCP calls and discovery.
        events: Publish every event of the run to the workflow's durable stream of this
            key (``True``: ``"pydantic_ai.events"``), one JSON item per event, for any
            stream reader (``dbos-agent stream ID KEY --follow``); the run then streams its
            model requests. Model events are written from their step, voided by a
            ``reset`` if it runs again; the others are checkpointed writes, never repeated
            by a replay (:mod:`.events`). The stream is left open for the workflow.
        approvals: Decide the calls that need approval (``requires_approval``,
            ``ApprovalRequired``) as dbos_agent approvals, waiting durably (the default);
            ``False`` leaves them to Pydantic AI's own flow, as outside a workflow: the run
            ends with them as its ``DeferredToolRequests`` output, and the workflow's next
            ``agent.run(message_history=..., deferred_tool_results=...)`` runs the approved
            ones, each as its tool step.

    A tool that is not idempotent (``"idempotent": False``) records its intent with its
    arguments before it runs; after a crash between the intent and its result the tool's
    ``guard(**arguments)`` decides (the earlier result, or ``da.NotDone`` to run it), and
    without a guard the workflow stops ``IN_DOUBT`` instead of repeating it.
    """

    engine_spec: ClassVar[DurabilityEngineSpec] = DurabilityEngineSpec(
        engine_name="dbos_agent",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="workflow",
        codec=JSON_CODEC,
        serialization_failure=_not_serializable,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        tool_call_result_upgrade_lenient=False,
        journal_discovery=True,
        sequential_tools_in_durable_context=False,
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        tool_config_key=METADATA_KEY,
        cancellation_error_types=(WorkflowCancelledError,),
        nondeterminism_error_types=(WorkflowDivergedError,),
    )

    def __init__(
        self,
        *,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        name: str | None = None,
        budget: Budget | None = None,
        model_step: StepOptions | None = None,
        tool_step: StepOptions | None = None,
        mcp_step: StepOptions | None = None,
        events: str | bool = False,
        approvals: bool = True,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._budget = BudgetGuard(budget)
        self._options = DbosAgentOperationConfig(
            model=model_step or {}, tool=tool_step or {}, mcp=mcp_step or {}
        )
        self._backend: DbosAgentOperationBackend | None = None
        key = events_key(events)
        self._events = None if key is None else EventPublisher(key)
        self._approvals = approvals

    def _bind_to_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> None:
        self._backend = DbosAgentOperationBackend(
            agent_name=self.name,
            default_model_id=self.default_model_id,
            config=self._options,
            budget=self._budget,
            max_tokens=self._call_max_tokens,
        )
        self._register_toolsets(agent)

    def _call_max_tokens(self, model_id: str | None, settings: Mapping[str, Any] | None) -> int:
        """The most tokens a request may write, as its budget check counts it: the run's
        ``max_tokens`` setting, else the model's maximum output (what Pydantic AI sends)."""
        if settings and settings.get("max_tokens"):
            return int(settings["max_tokens"])
        model = self._models_by_id.get(model_id or "default")
        profile = getattr(model, "profile", None)
        limit = profile.get("anthropic_max_output_tokens") if isinstance(profile, Mapping) else None
        return int(limit) if isinstance(limit, int) else DEFAULT_MAX_TOKENS

    def get_durable_operation_backend(self) -> DbosAgentOperationBackend:
        assert self._backend is not None, "Durability is bound to an agent first"
        return self._backend

    @property
    def in_durable_context(self) -> bool:
        return in_workflow_code()

    @property
    def in_durable_unit(self) -> bool:
        return in_step() or super().in_durable_unit

    async def wrap_run(
        self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        """The run, with this agent's budget in force for the agents its tools delegate to
        (see :mod:`.delegation`), and the item that ends its events when it publishes them."""
        with budget_in_force(self._budget):
            result = await super().wrap_run(ctx, handler=handler)
        if self._events is not None and in_workflow_code():
            await self._events.write_run_result(result.run_id, result.output)
        return result

    async def wrap_model_request(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        """Refuse a request that would run unrecorded inside a step while a budget is in
        force (an agent delegated to from a tool's step, see :mod:`.delegation`)."""
        if not self.in_durable_context:
            refuse_unrecorded_call(self.name, guard_for(self._budget))
        return await super().wrap_model_request(
            ctx, request_context=request_context, handler=handler
        )

    async def prepare_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """A request whose reply the log holds is answered from it here, before Pydantic AI
        prepares it for the wire, when nothing else acts on the attempt (:mod:`.replay`)."""
        request_context = await super().prepare_model_request(ctx, request_context)
        if (
            not self.in_durable_context
            or request_context.streaming
            or not answers_from_log(ctx.root_capability, self)
        ):
            return request_context
        model_id = self._model_id_for_request(ctx, request_context)
        backend = self.get_durable_operation_backend()
        recorded = await backend.replay_recorded_request(model_id)
        if recorded is None:
            return request_context
        response: ModelResponse = JSON_CODEC.load(ModelResponse, recorded)
        # what Pydantic AI stamps on a reply it was sent (its `_serving_model_id`)
        serving = request_context.model_id or request_context.model.model_id
        response.model_id = response.model_id or serving
        raise SkipModelRequest(response)

    async def prepare_tools(
        self, ctx: RunContext[AgentDepsT], tool_defs: list[ToolDefinition]
    ) -> list[ToolDefinition]:
        """In a workflow, a tool that is not a step runs alone: the steps its body takes (a
        delegate agent's requests) then have the same positions on every replay."""
        if not self.in_durable_context:
            return tool_defs
        return [
            tool_def if self._runs_as_step(tool_def) else replace(tool_def, sequential=True)
            for tool_def in tool_defs
        ]

    def _toolset_base_config(self, kind: ToolsetKind) -> Any:
        return self._options.base("tool", operation_id=ToolsetCallToolId(kind, toolset_id=""))

    async def durable_sleep(self, seconds: float) -> None:
        """Wait with ``da.aio.sleep``: its wake-up time is recorded, so a recovered run
        does not wait again through time that already passed."""
        if in_workflow_code():
            await sleep_async(seconds)
        else:
            await anyio.sleep(max(seconds, 0))

    def get_default_run_id(self) -> str | None:
        """The same ``run_id`` on every replay: the workflow id and the step position the
        run starts at (and how many runs started there before it)."""
        ctx = current_context()
        if ctx is None or in_step():
            return None
        position = ctx.positions_taken()
        runs = _runs_at.setdefault(ctx, {})
        index = runs.get(position, 0)
        runs[position] = index + 1
        base = f"{ctx.workflow_id}:{position}"
        return base if index == 0 else f"{base}:{index}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def after_tool_validate(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
    ) -> Any:
        """Reserve the call's log position while the reply's calls are validated in order,
        before they run concurrently (see ``backend._Reservations``)."""
        if self.in_durable_context and self._runs_as_step(tool_def):
            self.get_durable_operation_backend().reservations.reserve(ctx.run_id, call.tool_call_id)
        return args

    async def handle_deferred_tool_calls(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        requests: DeferredToolRequests,
    ) -> DeferredToolResults | None:
        """Decide the calls waiting for approval as dbos_agent approvals, inside a workflow.

        Each call is asked about with its tool and arguments (``dbos-agent approvals ID``
        lists them with their digest), and the run waits durably for the decisions: an
        approved call then runs as its tool step, once; a rejected one reaches the model
        as denied, with the reason (:mod:`.approvals`). Calls for external execution are
        left unresolved, and outside a workflow nothing is: as without this capability,
        the run ends with them as its ``DeferredToolRequests`` output; with
        ``approvals=False`` so does it inside one.
        """
        if not self.in_durable_context or not self._approvals:
            return None
        reservations = self.get_durable_operation_backend().reservations
        for call in requests.approvals:
            reservations.release(ctx.run_id, call.tool_call_id)
        return await decide_approvals(requests)

    def _runs_as_step(self, tool_def: ToolDefinition) -> bool:
        """Whether a call of this tool is one of this capability's tool steps."""
        if tool_def.toolset_id is None or tool_def.toolset_id not in self._toolsets_by_id:
            return False
        if tool_def.durable is False:
            return False
        return (tool_def.metadata or {}).get(METADATA_KEY) is not False

    # -- the run's events as a durable stream (``events=``; see .events) ------------------

    @property
    def has_wrap_run_event_stream(self) -> bool:
        """Stream the run (and so its model requests) when it publishes its events."""
        published = self._events is not None and self.in_durable_context
        return super().has_wrap_run_event_stream or published

    def _model_stream_event_handler(self) -> EventStreamHandler[AgentDepsT] | None:
        handler = super()._model_stream_event_handler()
        return handler if self._events is None else self._events.model_stream_handler(handler)

    async def wrap_run_event_stream(
        self, ctx: RunContext[AgentDepsT], *, stream: AsyncIterable[AgentStreamEvent]
    ) -> AsyncIterable[AgentStreamEvent]:
        events = super().wrap_run_event_stream(ctx, stream=stream)
        if self._events is not None:
            events = self._events.written_from_workflow(ctx, events)
        try:
            async for event in events:
                yield event
        finally:
            await aclose_if_supported(events)
