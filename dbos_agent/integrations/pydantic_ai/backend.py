"""Pydantic AI's durable operations as dbos_agent steps.

Pydantic AI routes every model request, tool call and MCP exchange of a durable run
through an *operation backend* (``pydantic_ai.durable_exec``). This one is a
``CallableOperationBackend``: each operation arrives as an async callback with a stable
name (Pydantic AI's journal namer: ``calc__model.request``,
``calc__function_toolset__math.call_tool:add``, ``calc__mcp_server__calc.call_tool``) and
runs as one ``da.step`` of that name, so its outcome is committed before the run moves on
and a recovered run replays it without calling anything.

What is recorded is JSON (the engine spec's ``JSON_CODEC``): a tool call's
``CallToolResult`` as Pydantic AI encodes it, and for a model request the document
``{"model", "usage", "response"}``: the usage in the Messages API's keys, so that the
agent layer's accounting, budgets and ``dbos-agent steps`` count these replies like its
own, and the whole ``ModelResponse``, which comes back typed on replay.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Literal, cast

from pydantic_ai.durable_exec._codec import JSON_CODEC
from pydantic_ai.durable_exec._model_error_codec import decode_model_error, encode_model_error
from pydantic_ai.durable_exec._operation import (
    DurableOperationConfig,
    DurableOperationId,
    ModelRequestId,
    OperationConfigRole,
    ToolsetCallToolId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.durable_exec._operation_backend import JournalCallableOperationBackend
from pydantic_ai.durable_exec._toolset import CallToolResult, wrap_tool_call_result
from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError, ModelRetry, UserError
from pydantic_ai.toolsets import ToolsetTool

from ..._engine.extending import (
    NotDone,
    StepOptions,
    StepSettings,
    WorkflowContext,
    at_position,
    current_context,
    in_step,
    layered,
)
from ..._engine.step import step as engine_step
from ..._engine.step import step_info
from ...agent.accounting import MODEL_STEP_NAMES
from ...agent.budget import BudgetGuard
from ...agent.replay import note_step
from ...agent.tool_registry import too_large_text
from ...errors import (
    BudgetExceededError,
    CheckpointTooLargeError,
    ConfigurationError,
    NotInStepError,
    RecordedModelError,
    UnavailableModelError,
)
from ...records import StepStatus
from .delegation import guard_for
from .outages import (
    MCP_DEFAULTS,
    MODEL_DEFAULTS,
    mcp_connect_failed,
    mcp_error_is_transient,
    model_error_is_transient,
    model_step_error_is_transient,
)

__all__ = [
    "METADATA_KEY",
    "DbosAgentOperationBackend",
    "DbosAgentOperationConfig",
    "RecordedModelError",
    "StepOptions",
    "in_workflow_code",
]

#: The tool metadata key of per-tool step options: ``metadata={"dbos_agent": {...}}``.
METADATA_KEY = "dbos_agent"

#: What a budget assumes a call may still spend when neither the model settings nor the
#: model's profile say how many tokens it may write.
DEFAULT_MAX_TOKENS = 4096

#: ``(model_id, model_settings)`` of a request to the most tokens the call may write.
MaxTokens = Callable[[str | None, Mapping[str, Any] | None], int]


#: The options that only tool calls take (a validation or a model call is never an effect).
_EFFECT_OPTIONS = ("idempotent", "guard")


def in_workflow_code() -> bool:
    """Whether this is a durable workflow's own code (not a step's, not outside one)."""
    return current_context() is not None and not in_step()


class DbosAgentOperationConfig(DurableOperationConfig[StepOptions]):
    """The step options of each operation: per role (model, MCP, other tools), and per tool
    from its metadata (``{"dbos_agent": {...}}`` merged over its role's, ``False`` for no
    step). A metadata mistake is the agent's code, a ``UserError`` as Pydantic AI raises."""

    def __init__(self, *, model: StepOptions, tool: StepOptions, mcp: StepOptions) -> None:
        model_defaults = {**MODEL_DEFAULTS, "retry_if": model_step_error_is_transient}
        self._model = _checked(layered(model_defaults, model), "model_step")
        self._tool = _checked(layered({}, tool), "tool_step")
        mcp_defaults = {**MCP_DEFAULTS, "retry_if": mcp_error_is_transient}
        self._mcp = _checked(layered(mcp_defaults, mcp), "mcp_step")

    def base(self, role: OperationConfigRole, *, operation_id: DurableOperationId) -> StepOptions:
        if role == "model":
            return self._model
        if getattr(operation_id, "toolset_kind", None) == "mcp":  # calls, discovery
            return self._mcp
        return _without_effects(self._tool) if role != "tool" else self._tool

    def for_tool(
        self,
        role: OperationConfigRole,
        *,
        operation_id: DurableOperationId,
        tool: object | None,
        tool_name: str,
    ) -> StepOptions | Literal[False]:
        options = self.base(role, operation_id=operation_id)
        metadata = tool.tool_def.metadata if isinstance(tool, ToolsetTool) else None
        own = (metadata or {}).get(METADATA_KEY)
        if own is False:
            return False
        if own is not None:
            if not isinstance(own, Mapping):
                raise UserError(
                    f"tool {tool_name!r}: metadata {METADATA_KEY!r} must be a dict of step "
                    f"options (StepOptions) or False, got {type(own).__name__}"
                )
            owner = f"tool {tool_name!r}: its {METADATA_KEY!r} metadata"
            options = _checked(layered(options, own), owner)
        if isinstance(operation_id, ToolsetValidateToolArgumentsId):
            return _without_effects(options)
        if getattr(operation_id, "toolset_kind", None) == "mcp":
            options = _mcp_call_options(options, own)
        return options


def _waiting_for_server(options: StepOptions, toolset_id: str | None) -> StepOptions:
    """An MCP operation's options, waiting for its server by name (unless told otherwise)."""
    if not toolset_id or options.get("waits_for") != MCP_DEFAULTS["waits_for"]:
        return options
    return cast(StepOptions, {**options, "waits_for": f"MCP server {toolset_id!r}"})


def _mcp_call_options(options: StepOptions, own: Mapping[str, Any] | None) -> StepOptions:
    """An MCP call's options: a non-idempotent call waits out only a failure to connect
    (:func:`mcp_connect_failed`: nothing was sent) unless its own options say which
    errors to retry or for how long (it must not be sent twice, and whether a failed one
    reached the server cannot be told); given ``retry_if`` alone, no horizon, as before."""
    own = own or {}
    if options.get("idempotent") is not False or "give_up_after" in own:
        return options
    if "retry_if" in own:
        return layered(options, {"give_up_after": None})
    return layered(options, {"retry_if": mcp_connect_failed})


def _checked(options: StepOptions, owner: str) -> StepOptions:
    """``options`` if they are all step options of fitting values (checked as ``@da.step``
    checks its own); a mistake is the agent's code, a ``UserError`` as Pydantic AI raises."""
    try:
        StepSettings.of(options, owner)
    except (TypeError, ValueError) as wrong:
        raise UserError(str(wrong)) from None
    return options


def _without_effects(options: StepOptions) -> StepOptions:
    return cast(StepOptions, {k: v for k, v in options.items() if k not in _EFFECT_OPTIONS})


#: The operation body the step of this context runs (a step's arguments are what its
#: intent records, so the callback itself travels beside them).
_body: contextvars.ContextVar[Callable[[], Awaitable[object]] | None] = contextvars.ContextVar(
    "dbos_agent_pydantic_ai_body", default=None
)


async def _run_body(**arguments: Any) -> Any:
    """The function of every operation step: runs the body the caller set."""
    body = _body.get()
    assert body is not None, "an operation step runs only through the backend"
    return await body()


def _settled(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """The value of a coroutine that never suspends (run without an event loop)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("the coroutine suspended")


async def _ready(value: Any) -> Any:
    return value


def _recorded_guard(guard: Callable[..., Any]) -> Callable[..., Any]:
    """A tool's guard as its step's: the earlier result in the step's recorded form."""

    @functools.wraps(guard)
    def recorded(**arguments: Any) -> Any:
        earlier = guard(**arguments)
        if earlier is NotDone:
            return NotDone
        result = _settled(wrap_tool_call_result(_ready(earlier)))
        return JSON_CODEC.dump(CallToolResult, result)

    return recorded


def anthropic_usage(usage: Mapping[str, Any] | None) -> dict[str, int]:
    """Pydantic AI's ``RequestUsage`` (JSON) in the Messages API's keys.

    Pydantic AI counts cache writes and reads inside ``input_tokens``; the Messages API
    (and so the agent layer's accounting and prices) counts them apart.
    """
    usage = usage or {}

    def count(key: str) -> int:
        value = usage.get(key)
        return int(value) if isinstance(value, int | float) else 0

    write, read = count("cache_write_tokens"), count("cache_read_tokens")
    return {
        "input_tokens": max(count("input_tokens") - write - read, 0),
        "output_tokens": count("output_tokens"),
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
    }


class _Reservations:
    """Log positions reserved for the tool calls of a run, in the order they were validated.

    Pydantic AI validates a reply's tool calls one after the other, then runs them as
    concurrent tasks: which of them reaches its step first is up to the scheduler (and
    the thread a non-idempotent step records its intent from). Each call takes the
    position reserved for it at validation instead, as ``ToolRegistry.call_all_async``
    does, so a replay never depends on which started or finished first. A reserved
    position that no step takes (a call deferred after validation) stays a gap in the
    log, the same on every replay.
    """

    def __init__(self) -> None:
        self._by_run: weakref.WeakKeyDictionary[
            WorkflowContext, dict[tuple[str | None, str], list[int]]
        ] = weakref.WeakKeyDictionary()

    def reserve(self, run_id: str | None, tool_call_id: str) -> None:
        ctx = current_context()
        if ctx is None or in_step():
            return
        (position,) = ctx.reserve(1)
        self._by_run.setdefault(ctx, {}).setdefault((run_id, tool_call_id), []).append(position)

    def release(self, run_id: str | None, tool_call_id: str) -> None:
        """Forget the positions still reserved for a call that waits for a decision: once
        approved it is validated again and runs at the position reserved then, after the
        approval's steps, so the log reads in the order things happened."""
        ctx = current_context()
        if ctx is not None:
            self._by_run.get(ctx, {}).pop((run_id, tool_call_id), None)

    def take(self, run_id: str | None, tool_call_id: str | None) -> int | None:
        ctx = current_context()
        if ctx is None or tool_call_id is None:
            return None
        waiting = self._by_run.get(ctx, {}).get((run_id, tool_call_id))
        return waiting.pop(0) if waiting else None


class DbosAgentOperationBackend(JournalCallableOperationBackend[StepOptions]):
    """Runs each Pydantic AI durable operation as one dbos_agent step of its journal name.

    Outside a workflow (or inside a step) an operation is a plain call, as a step is.
    """

    def __init__(
        self,
        *,
        agent_name: str,
        default_model_id: str | None,
        config: DbosAgentOperationConfig,
        budget: BudgetGuard,
        max_tokens: MaxTokens,
    ) -> None:
        super().__init__(agent_name=agent_name, default_model_id=default_model_id, config=config)
        self._options = config
        self._budget = budget
        self._max_tokens = max_tokens
        self._steps: dict[tuple[str, tuple[tuple[str, Any], ...]], Callable[..., Any]] = {}
        self.reservations = _Reservations()
        for streaming in (False, True):
            MODEL_STEP_NAMES.add(
                self._namer.operation_name(
                    ModelRequestId(None, streaming=streaming, model_name="default")
                )
            )

    def execution_attempt(self) -> int:
        try:
            return step_info().attempt
        except NotInStepError:
            return 1

    def _step(self, name: str, options: StepOptions) -> Callable[..., Any]:
        """The step of this name and these options (made once, then reused)."""
        key = (name, tuple(sorted(options.items())))
        made = self._steps.get(key)
        if made is None:
            given: dict[str, Any] = dict(options)
            guard = options.get("guard")
            if guard is not None:
                given["guard"] = _recorded_guard(guard)
            made = engine_step(name=name, **given)(_run_body)
            self._steps[key] = made
        return made

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: StepOptions,
    ) -> object:
        if not in_workflow_code():
            return await body()
        if isinstance(operation_id, ModelRequestId):
            return await self._model_request(name, body, cache_key, config)
        if getattr(operation_id, "toolset_kind", None) == "mcp":  # known by name only here
            config = _waiting_for_server(config, getattr(operation_id, "toolset_id", None))
        position = None
        arguments: dict[str, Any] = {}
        if isinstance(operation_id, ToolsetCallToolId):
            note_step()
            tool_args, run_context = cache_key[1], cache_key[2]
            arguments = dict(cast(Mapping[str, Any], tool_args))
            position = self.reservations.take(
                getattr(run_context, "run_id", None), getattr(run_context, "tool_call_id", None)
            )
        else:
            config = _without_effects(config)
        token = _body.set(body)
        try:
            with at_position(position):
                return await self._step(name, config)(**arguments)
        except CheckpointTooLargeError as too_large:  # the call's recorded outcome
            if isinstance(operation_id, ToolsetCallToolId):  # the model's to handle
                raise ModelRetry(too_large_text(too_large)) from None
            raise
        finally:
            _body.reset(token)

    async def _model_request(
        self,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: StepOptions,
    ) -> object:
        """A model request: budget first, then one step whose record the accounting reads."""
        MODEL_STEP_NAMES.add(name)
        model_id = cast(str | None, cache_key[0])
        max_tokens = self._max_tokens(model_id, cast(Mapping[str, Any] | None, cache_key[2]))
        budget = guard_for(self._budget)
        await budget.publish_async()
        note_step()
        step = self._step(name, _without_effects(config))
        token = _body.set(functools.partial(self._recorded_request, body, max_tokens, budget))
        try:
            while True:
                try:
                    recorded = await step()
                except BudgetExceededError as refused:
                    await budget.wait_for_raise_async(refused)
                    continue
                except RecordedModelError as error:
                    raise decode_model_error(error.encoded) or error from None
                return cast(Mapping[str, Any], recorded)["response"]
        finally:
            _body.reset(token)

    async def replay_recorded_request(self, model_id: str | None) -> Mapping[str, Any] | None:
        """The recorded reply (Pydantic AI's JSON of the ``ModelResponse``) of a request to
        ``model_id`` whose step the log holds at the next position, taken as its step;
        ``None`` (nothing taken) when the next entry is anything else, so the request goes
        the long way and meets whatever is there (see :mod:`.replay`)."""
        ctx = current_context()
        if ctx is None or in_step():
            return None
        operation_id = ModelRequestId(model_id, streaming=False, model_name="")
        name = self._namer.operation_name(operation_id)
        row = ctx.next_recorded()
        if row is None or row.name != name or row.status is not StepStatus.SUCCESS:
            return None
        config = self._options.base("model", operation_id=operation_id)
        response = await self._model_request(name, _never_sent, (model_id, None, None), config)
        return cast(Mapping[str, Any], response)

    async def _recorded_request(
        self, body: Callable[[], Awaitable[object]], max_tokens: int, budget: BudgetGuard
    ) -> dict[str, Any]:
        """Inside the model step: check the budget, call the model, and record the reply
        with its usage in the Messages API's keys (and a model error as one replay can
        raise again)."""
        if budget.budget is not None:
            await asyncio.to_thread(budget.check, {"max_tokens": max_tokens})
        try:
            response = cast(Mapping[str, Any], await body())
        except ModelHTTPError as error:
            if error.status_code in (401, 403):
                raise ConfigurationError(
                    f"the model API refused this process's credentials (HTTP "
                    f"{error.status_code}): configure the model's API key and run the "
                    "workflow again"
                ) from None
            raise _recordable(error) from None
        except ModelAPIError as error:
            raise _recordable(error) from None
        return {
            "model": response.get("model_name") or "unknown",
            "usage": anthropic_usage(cast(Mapping[str, Any] | None, response.get("usage"))),
            "response": response,
        }


async def _never_sent() -> object:
    raise AssertionError("a replayed model request is answered from its record")


def _recordable(error: ModelAPIError) -> Exception:
    """A model error as the log can keep it whole (itself if Pydantic AI cannot encode it):
    an :class:`UnavailableModelError` when the step should wait it out."""
    encoded = encode_model_error(error)
    if encoded is None:
        return error
    if model_error_is_transient(error):
        return UnavailableModelError(str(error), encoded)
    return RecordedModelError(str(error), encoded)
