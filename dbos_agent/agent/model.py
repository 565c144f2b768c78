"""The model call as a durable step: the whole ``Message`` is checkpointed, usage included.

The client is configuration, not data: it is held by the :class:`Model` (or set once with
:func:`configure`) and never passed to the step function, so neither it nor its API key can
reach the step log. Only the request (model, messages, tools...) goes in and only the reply
comes out. A replayed call returns the recorded ``anthropic.types.Message`` without a
request: it is neither streamed again nor paid again.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, cast

import anthropic
from anthropic.types import Message, MessageParam, ToolParam

from ..engine.step import step as durable_step
from ..errors import ConfigurationError
from .accounting import MODEL_STEP_NAMES
from .replay import note_step
from .retrying import RETRYABLE_TYPES, ModelRetryPolicy
from .tool_registry import ToolRegistry

__all__ = ["DEFAULT_MODEL", "MODEL_STEP_NAME", "Model", "configure", "default_client"]

DEFAULT_MODEL = "claude-sonnet-4-5"
#: The step name of model calls, streamed or not (so a recovered run may switch).
MODEL_STEP_NAME = "anthropic.messages"

TextCallback = Callable[[str], None]

_default_client: anthropic.Anthropic | None = None
_on_text: ContextVar[TextCallback | None] = ContextVar("dbos_agent_on_text", default=None)


def configure(*, client: anthropic.Anthropic) -> None:
    """Set the client every :class:`Model` without its own client uses (process-wide)."""
    global _default_client
    _default_client = client


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
    ``jitter``; each attempt is counted in the step log. Other errors (a 400, a 401) are
    recorded and raised at once. The client's own retries are switched off so that there
    is exactly one retry loop.
    """

    def __init__(
        self,
        client: anthropic.Anthropic | None = None,
        *,
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
        max_retry_after: float = 120.0,
        step_name: str = MODEL_STEP_NAME,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.system = system
        self.tools = tools
        self.timeout = timeout
        self.step_name = step_name
        self._client = client
        self._bound: tuple[anthropic.Anthropic, anthropic.Anthropic] | None = None
        self._lock = threading.Lock()
        policy = ModelRetryPolicy(
            retries,
            interval,
            backoff,
            max_interval,
            jitter,
            RETRYABLE_TYPES,
            max_retry_after=max_retry_after,
        )
        MODEL_STEP_NAMES.add(step_name)

        def call_model(request: dict[str, Any], stream: bool) -> Message:
            return self._call(request, stream)

        self._step = durable_step(name=step_name, retry_policy=policy)(call_model)

    def client(self) -> anthropic.Anthropic:
        """The client used for calls: no client-side retries, this model's timeout."""
        base = self._client or default_client()
        with self._lock:
            if self._bound is None or self._bound[0] is not base:
                options: dict[str, Any] = {"max_retries": 0}
                if self.timeout is not None:
                    options["timeout"] = self.timeout
                self._bound = (base, base.with_options(**options))
            return self._bound[1]

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

    def create(self, messages: Iterable[MessageParam], **overrides: Any) -> Message:
        """One model call as a step (``messages.create``); ``overrides`` go into the request."""
        note_step()
        result: Message = self._step(self.request(messages, **overrides), False)
        return result

    def stream(
        self,
        messages: Iterable[MessageParam],
        on_text: TextCallback | None = None,
        **overrides: Any,
    ) -> Message:
        """Like :meth:`create`, streaming: ``on_text`` gets each text delta as it arrives.

        Only the final ``Message`` is checkpointed. A replayed call calls ``on_text`` never.
        A retried attempt streams again from its start.
        """
        note_step()
        token = _on_text.set(on_text)
        try:
            result: Message = self._step(self.request(messages, **overrides), True)
        finally:
            _on_text.reset(token)
        return result

    def _call(self, request: dict[str, Any], stream: bool) -> Message:
        with _configuration_errors():
            client = self.client()
            if not stream:
                return cast(Message, client.messages.create(**request))
            on_text = _on_text.get()
            with client.messages.stream(**request) as events:
                for chunk in events.text_stream:
                    if on_text is not None:
                        on_text(chunk)
                return events.get_final_message()


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
