"""The model call as a durable step: the whole ``Message`` is checkpointed, usage included.

The client is configuration, not data: it is held by the :class:`Model` (or set once with
:func:`configure`) and never passed to the step function, so neither it nor its API key can
reach the step log. Only the request (model, messages, tools...) goes in and only the reply
comes out. A replayed call returns the recorded ``anthropic.types.Message`` without a
request: it is neither streamed again nor paid again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, cast

import anthropic
from anthropic.types import Message, MessageParam, ToolParam

from .._engine.extending import seconds_option, tracing
from .._engine.step import step as durable_step
from .._engine.streams import write_stream, write_stream_async
from ..errors import BudgetExceededError, ConfigurationError
from .accounting import MODEL_STEP_NAMES
from .budget import Budget, BudgetGuard
from .replay import note_step
from .retrying import RETRYABLE_TYPES, ModelRetryPolicy
from .tool_registry import ToolRegistry

__all__ = [
    "DEFAULT_MODEL",
    "MODEL_STEP_NAME",
    "Model",
    "configure",
    "default_async_client",
    "default_client",
]

DEFAULT_MODEL = "claude-sonnet-4-5"
#: How long a model call waits out a failing provider (transient errors) before its
#: error is recorded: a provider's bad afternoon, not a workflow error.
DEFAULT_GIVE_UP_AFTER = 24 * 3600.0
#: What a model call that waits for its next attempt waits for, as operators read it.
MODEL_API = "the model API"
#: The step name of model calls, streamed or not (so a recovered run may switch).
MODEL_STEP_NAME = "anthropic.messages"

TextCallback = Callable[[str], None]

_default_client: anthropic.Anthropic | None = None
_default_async_client: anthropic.AsyncAnthropic | None = None
_on_text: ContextVar[TextCallback | None] = ContextVar("dbos_agent_on_text", default=None)
_stream_key: ContextVar[str | None] = ContextVar("dbos_agent_stream_key", default=None)


def configure(
    *,
    client: anthropic.Anthropic | None = None,
    async_client: anthropic.AsyncAnthropic | None = None,
) -> None:
    """Set the clients every :class:`Model` without its own uses (process-wide).

    Without ``async_client``, async calls use one made from ``client``'s key and URL.
    """
    global _default_client, _default_async_client
    if client is not None:
        _default_client = client
    if async_client is not None or client is not None:
        _default_async_client = async_client


def async_twin(client: anthropic.Anthropic) -> anthropic.AsyncAnthropic:
    """An async client with the same credentials, URL and timeout as ``client``."""
    return anthropic.AsyncAnthropic(
        api_key=client.api_key,
        auth_token=client.auth_token,
        base_url=client.base_url,
        timeout=client.timeout,
        max_retries=client.max_retries,
    )


def default_async_client() -> anthropic.AsyncAnthropic:
    """The configured async client, else the twin of a configured sync client, else one
    built from the environment."""
    global _default_async_client
    if _default_async_client is None:
        sync = _default_client
        _default_async_client = anthropic.AsyncAnthropic() if sync is None else async_twin(sync)
    return _default_async_client


def default_client() -> anthropic.Anthropic:
    """The configured client, else one built from the environment (``ANTHROPIC_API_KEY``)."""
    global _default_client
    if _default_client is None:
        _default_client = anthropic.Anthropic()
    return _default_client


class Model:
    """A model configuration whose calls are durable steps with self-healing retries.

    Transient failures (529 overloaded, 429 honouring ``retry-after``, 408/409, 5xx,
    timeouts, connection errors) are retried up to ``retries`` times by the step, with
    exponential backoff (``interval * backoff**n``, at most ``max_interval``) and +/-
    ``jitter``, and then on, with the same capped backoff, until ``give_up_after`` (24
    hours by default; None: ``retries`` alone) has passed since the call's first attempt:
    a provider's outage of minutes or hours never ends the agent. A wait longer than
    ``launch(suspend_after=)`` is durable: the workflow is SUSPENDED (no thread held,
    surviving kill -9 and take-over) and ``workflows list/show`` say it waits for the
    model API, since when, its attempts, its next attempt and its last error
    (``dbos-agent retry ID`` tries now). Each attempt is counted in the step log; a
    failed one charges no budget. Other errors (a 400) are recorded and raised at once;
    refused credentials (401/403) are this process's configuration, never recorded. The
    client's own retries are switched off so that there is exactly one retry loop.

    ``budget=Budget(max_tokens=..., max_cost_usd=...)`` refuses a call the workflow's
    family cannot afford with a recorded BudgetExceededError (see budget.py); the budget
    is published as the workflow's ``dbos_agent.budget`` event (shown by
    ``dbos-agent workflows show`` and the dashboard).

    ``create_async`` / ``stream_async`` are the same calls for async workflows, through
    ``async_client`` (default: the async twin of ``client``, else the configured one);
    both kinds record the same step, so a run may switch between them.
    """

    def __init__(
        self,
        client: anthropic.Anthropic | None = None,
        *,
        async_client: anthropic.AsyncAnthropic | None = None,
        model: str = DEFAULT_MODEL,
        max_tokens: int = 4096,
        system: str | None = None,
        tools: ToolRegistry | Sequence[ToolParam] | None = None,
        timeout: float | None = None,
        retries: int = 8,
        interval: float = 1.0,
        backoff: float = 2.0,
        max_interval: float = 60.0,
        jitter: float = 0.25,
        max_retry_after: float | None = None,
        step_name: str = MODEL_STEP_NAME,
        budget: Budget | None = None,
        give_up_after: float | timedelta | None = DEFAULT_GIVE_UP_AFTER,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.system = system
        self.tools = tools
        self.timeout = timeout
        self.step_name = step_name
        self._budget = BudgetGuard(budget)
        self._client = client
        self._async_client = async_client
        self._bound: tuple[anthropic.Anthropic, anthropic.Anthropic] | None = None
        self._bound_async: tuple[anthropic.AsyncAnthropic, anthropic.AsyncAnthropic] | None = None
        self._lock = threading.Lock()
        policy = ModelRetryPolicy(
            retries,
            interval,
            backoff,
            max_interval,
            jitter,
            RETRYABLE_TYPES,
            give_up_after=seconds_option(give_up_after),
            waits_for=MODEL_API,
            max_retry_after=max_retry_after,
        )
        MODEL_STEP_NAMES.add(step_name)

        def call_model(request: dict[str, Any], stream: bool) -> Message:
            return self._call(request, stream)

        async def call_model_async(request: dict[str, Any], stream: bool) -> Message:
            return await self._call_async(request, stream)

        self._step = durable_step(name=step_name, retry_policy=policy)(call_model)
        self._step_async = durable_step(name=step_name, retry_policy=policy)(call_model_async)

    def _client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"max_retries": 0}
        if self.timeout is not None:
            options["timeout"] = self.timeout
        return options

    def client(self) -> anthropic.Anthropic:
        """The client used for calls: no client-side retries, this model's timeout."""
        base = self._client or default_client()
        with self._lock:
            if self._bound is None or self._bound[0] is not base:
                self._bound = (base, base.with_options(**self._client_options()))
            return self._bound[1]

    def async_client(self) -> anthropic.AsyncAnthropic:
        """The client used for async calls, configured like :meth:`client`'s."""
        if self._async_client is None and self._client is not None:
            self._async_client = async_twin(self._client)
        base = self._async_client or default_async_client()
        with self._lock:
            if self._bound_async is None or self._bound_async[0] is not base:
                self._bound_async = (base, base.with_options(**self._client_options()))
            return self._bound_async[1]

    def request(self, messages: Iterable[MessageParam], **overrides: Any) -> dict[str, Any]:
        """The Messages API request for ``messages`` (JSON-friendly; no credentials)."""
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": list(messages),
        }
        if self.system is not None:
            request["system"] = self.system
        tools = self.tools.params() if isinstance(self.tools, ToolRegistry) else self.tools
        if tools:
            request["tools"] = list(tools)
        request.update(overrides)
        return request

    @property
    def budget(self) -> Budget | None:
        """Refuses calls past this budget, counted over the workflow's family (budget.py)."""
        return self._budget.budget

    @budget.setter
    def budget(self, budget: Budget | None) -> None:
        self._budget.budget = budget

    def _call_step(self, request: dict[str, Any], stream: bool) -> Message:
        while True:
            try:
                result: Message = self._step(request, stream)
                return result
            except BudgetExceededError as refused:
                self._budget.wait_for_raise(refused)

    async def _call_step_async(self, request: dict[str, Any], stream: bool) -> Message:
        while True:
            try:
                result: Message = await self._step_async(request, stream)
                return result
            except BudgetExceededError as refused:
                await self._budget.wait_for_raise_async(refused)

    def create(self, messages: Iterable[MessageParam], **overrides: Any) -> Message:
        """One model call as a step (``messages.create``); ``overrides`` go into the request."""
        self._budget.publish()
        note_step()
        return self._call_step(self.request(messages, **overrides), False)

    def stream(
        self,
        messages: Iterable[MessageParam],
        on_text: TextCallback | None = None,
        *,
        stream_key: str | None = None,
        **overrides: Any,
    ) -> Message:
        """Like :meth:`create`, streaming: ``on_text`` gets each text delta as it arrives.

        Only the final ``Message`` is checkpointed. A replayed call calls ``on_text`` never.
        A retried attempt streams again from its start. With ``stream_key`` the deltas
        are also published to the workflow's durable stream of that key
        (``da.read_stream``), tagged with this step: a retried or re-run call's earlier
        deltas are voided by a reset item, and a replayed call publishes nothing.
        """
        self._budget.publish()
        note_step()
        tokens = _on_text.set(on_text), _stream_key.set(stream_key)
        try:
            result = self._call_step(self.request(messages, **overrides), True)
        finally:
            _on_text.reset(tokens[0])
            _stream_key.reset(tokens[1])
        return result

    async def create_async(self, messages: Iterable[MessageParam], **overrides: Any) -> Message:
        """:meth:`create` for async workflows: the call awaits, holding no thread."""
        await self._budget.publish_async()
        await self._list_tools_async()
        note_step()
        return await self._call_step_async(self.request(messages, **overrides), False)

    async def stream_async(
        self,
        messages: Iterable[MessageParam],
        on_text: TextCallback | None = None,
        *,
        stream_key: str | None = None,
        **overrides: Any,
    ) -> Message:
        """:meth:`stream` for async workflows (``on_text`` is called on the event loop)."""
        await self._budget.publish_async()
        await self._list_tools_async()
        note_step()
        tokens = _on_text.set(on_text), _stream_key.set(stream_key)
        try:
            result = await self._call_step_async(self.request(messages, **overrides), True)
        finally:
            _on_text.reset(tokens[0])
            _stream_key.reset(tokens[1])
        return result

    async def _list_tools_async(self) -> None:
        """List a registry's MCP tools (once per run, a step) before the request needs
        them: :meth:`request` is sync and would otherwise list them blocking the loop."""
        if isinstance(self.tools, ToolRegistry):
            await self.tools.list_tools_async()

    async def _call_async(self, request: dict[str, Any], stream: bool) -> Message:
        if self.budget is not None:
            await asyncio.to_thread(self._budget.check, request)
        with tracing.span(_chat_span, request) as current, _configuration_errors():
            client = self.async_client()
            if not stream:
                reply = cast(Message, await client.messages.create(**request))
            else:
                on_text, key = _on_text.get(), _stream_key.get()
                async with client.messages.stream(**request) as events:
                    async for chunk in events.text_stream:
                        if on_text is not None:
                            on_text(chunk)
                        if key is not None:
                            await write_stream_async(key, chunk)
                    reply = await events.get_final_message()
            tracing.set_attributes(current, _chat_reply(reply))
            return reply

    def _call(self, request: dict[str, Any], stream: bool) -> Message:
        self._budget.check(request)
        with tracing.span(_chat_span, request) as current, _configuration_errors():
            client = self.client()
            if not stream:
                reply = cast(Message, client.messages.create(**request))
            else:
                on_text, key = _on_text.get(), _stream_key.get()
                with client.messages.stream(**request) as events:
                    for chunk in events.text_stream:
                        if on_text is not None:
                            on_text(chunk)
                        if key is not None:
                            write_stream(key, chunk)
                    reply = events.get_final_message()
            tracing.set_attributes(current, _chat_reply(reply))
            return reply


def _chat_span(request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A model call's span (OpenTelemetry's gen_ai semantic conventions)."""
    model = str(request.get("model"))
    return f"chat {model}", {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "anthropic",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": int(request.get("max_tokens") or 0),
    }


def _chat_reply(reply: Message) -> dict[str, Any]:
    usage = reply.usage
    return {
        "gen_ai.response.model": reply.model,
        "gen_ai.response.id": reply.id,
        "gen_ai.response.finish_reasons": [str(reply.stop_reason or "")],
        "gen_ai.usage.input_tokens": usage.input_tokens if usage else None,
        "gen_ai.usage.output_tokens": usage.output_tokens if usage else None,
    }


@contextlib.contextmanager
def _configuration_errors() -> Iterator[None]:
    """No API key, or one the API refuses, is this process's configuration, not the model
    call's outcome: a ConfigurationError, never recorded, and the workflow stays PENDING."""
    try:
        yield
    except anthropic.AuthenticationError as exc:
        raise ConfigurationError(
            f"the Messages API refused this process's credentials (HTTP {exc.status_code}): "
            f"set ANTHROPIC_API_KEY or configure(client=...) and run the workflow again"
        ) from None
    except TypeError as exc:
        if "authentication" not in str(exc).lower():
            raise
        raise ConfigurationError(
            "no model client is configured in this process (no ANTHROPIC_API_KEY): set it or "
            "call dbos_agent.agent.configure(client=...) before the workflow runs"
        ) from None
