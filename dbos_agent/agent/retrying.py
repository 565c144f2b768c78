"""Self-healing model calls: which API failures are worth another attempt, and when.

The engine's step retry loop is the only retry loop for model calls (the client is used
with ``max_retries=0``): every attempt then shows in the step log's ``attempts`` column, and
there is one retry budget instead of the client's retries multiplied by the step's. This
module supplies the two things the generic loop cannot know: which errors are transient
(overloaded, rate-limited, 5xx, timeouts, dropped connections) and how long the server
asked us to wait (``retry-after``), which takes precedence over our own backoff when longer.
A provider's outage longer than the in-process retries is then waited out durably, up to
the model's ``give_up_after`` (_engine/runtime/retries.py).
"""

from __future__ import annotations

import email.utils
import importlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

import anthropic

from .._engine.extending import RetryPolicy


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's transport errors: a stream cut mid-reply raises them unwrapped."""
    for name in ("httpx2", "httpx"):  # the one this anthropic version is built on
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        error = getattr(module, "TransportError", None)
        if isinstance(error, type) and issubclass(error, BaseException):
            return (error,)
    return ()


TRANSPORT_ERRORS = _transport_errors()

#: Exception types that may be transient; :func:`is_retryable` decides on the status code.
RETRYABLE_TYPES: tuple[type[BaseException], ...] = (
    anthropic.APIConnectionError,  # includes APITimeoutError
    anthropic.APIStatusError,
    *TRANSPORT_ERRORS,
)

_RETRYABLE_STATUS = frozenset({408, 409, 429})
# Error types of an `error` event in the middle of a 200 stream that are worth a retry.
_RETRYABLE_STREAM_ERRORS = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
)


def _stream_error_type(body: object) -> str | None:
    error = body.get("error") if isinstance(body, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    return kind if isinstance(kind, str) else None


def is_retryable(error: BaseException) -> bool:
    """True for 529/overloaded, 429, 408, 409, any 5xx, timeouts and connection errors.

    Also for an overloaded (or 5xx-like) ``error`` event in the middle of a stream, and for
    a connection cut mid-stream. Never for other 4xx (a 400 will fail the same way again).
    A server that says ``x-should-retry: false`` is obeyed.
    """
    if isinstance(error, (anthropic.APIConnectionError, *TRANSPORT_ERRORS)):
        return True
    if not isinstance(error, anthropic.APIStatusError):
        return False
    response = getattr(error, "response", None)
    if response is not None and response.headers.get("x-should-retry") == "false":
        return False
    status = error.status_code
    if status < 400:  # an error event inside a successful (streamed) response
        return _stream_error_type(error.body) in _RETRYABLE_STREAM_ERRORS
    return status in _RETRYABLE_STATUS or status >= 500


def retry_after_seconds(error: BaseException) -> float | None:
    """The wait the server asked for (``retry-after-ms`` or ``retry-after``), if any."""
    response = getattr(error, "response", None)
    if not isinstance(error, anthropic.APIStatusError) or response is None:
        return None
    headers = response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(0.0, float(raw) * scale)
        except ValueError:
            parsed = email.utils.parsedate_tz(raw)
            if parsed is not None:
                return max(0.0, email.utils.mktime_tz(parsed) - time.time())
    return None


@dataclass(frozen=True, slots=True)
class ModelRetryPolicy(RetryPolicy):
    """Exponential backoff with jitter for transient API errors, honouring ``retry-after``.

    Which errors are transient is :func:`is_retryable`'s answer; with ``give_up_after``
    (the :class:`~dbos_agent.agent.Model` default: 24 hours) they are waited out durably
    past ``retries`` (see ``@da.step``). ``max_retry_after``, when set, caps how long a
    ``retry-after`` may make the step wait: a longer demand gives up (the error is
    recorded). None (the default) honours any demand: a durable wait holds no thread.
    """

    max_retry_after: float | None = None

    def transient(self, error: BaseException) -> bool:
        if not is_retryable(error):
            return False
        asked = retry_after_seconds(error)
        return asked is None or self.max_retry_after is None or asked <= self.max_retry_after

    def backoff_delay(self, attempt: int, error: BaseException) -> float:
        return max(
            RetryPolicy.backoff_delay(self, attempt, error), retry_after_seconds(error) or 0.0
        )
