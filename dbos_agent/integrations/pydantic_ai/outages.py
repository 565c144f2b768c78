"""What a Pydantic AI run waits out instead of failing: its model provider and its MCP
servers being down.

A model request's step and an MCP discovery or call step get, by default, a horizon of
24 hours (``give_up_after``) during which a *transient* failure is tried again, durably
(the workflow is suspended meanwhile, see ``_engine/runtime/retries.py``), and say what
they wait for (``waits_for``). Which failures are transient is decided here:

* a model error is, when Pydantic AI's category says the provider is rate-limited,
  overloaded, unavailable, failing on its side or unreachable (a 408, 409, 429, 5xx or
  529, a timeout, a dropped connection), unless the provider said not to retry
  (``x-should-retry: false``); a 400, a quota used up or a refused request is not;
* an MCP failure is, when the server could not be reached or went away (its process
  did not start or exited, its port refused, the handshake timed out, the session
  closed), not when it answered with an error.

The options a ``Durability`` is given for a role, or a tool in its metadata, go over
these defaults; ``give_up_after=None`` there means no horizon (``retries`` alone). A
non-idempotent MCP call gets no horizon unless its options give one: Pydantic AI's MCP
client cannot say whether a failed call reached the server, and it must not run twice.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelConnectionError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelServerError,
    ModelUnavailableError,
)

from ...agent.mcp_connections import is_connection_failure
from ...agent.model import DEFAULT_GIVE_UP_AFTER, MODEL_API

#: What a model request's step is given unless the Durability's options say otherwise
#: (with ``retry_if``: :func:`model_step_error_is_transient`).
MODEL_DEFAULTS: dict[str, Any] = {"give_up_after": DEFAULT_GIVE_UP_AFTER, "waits_for": MODEL_API}
#: What an MCP discovery or call step is given unless the options say otherwise (with
#: ``retry_if``: :func:`mcp_error_is_transient`).
MCP_DEFAULTS: dict[str, Any] = {
    "give_up_after": DEFAULT_GIVE_UP_AFTER,
    "waits_for": "an MCP server",
}

_TRANSIENT_CATEGORIES = (
    ModelRateLimitError,
    ModelUnavailableError,
    ModelServerError,
    ModelConnectionError,
)
_TRANSIENT_STATUS = frozenset({408, 409, 429})


def model_error_is_transient(error: ModelAPIError) -> bool:
    """Whether a model request that failed with ``error`` may succeed later by itself."""
    if isinstance(error, ModelHTTPError):
        if error.provider_retry_hint is False:
            return False
        if error.status_code in _TRANSIENT_STATUS or error.status_code >= 500:
            return True
    return isinstance(error, _TRANSIENT_CATEGORIES)


def model_step_error_is_transient(error: BaseException) -> bool:
    """The ``retry_if`` of model request steps by default: a model error as
    :func:`model_error_is_transient` says (one Pydantic AI could not encode reaches the
    step as itself), anything else only if it is a connection failure."""
    if isinstance(error, ModelAPIError):
        return model_error_is_transient(error)
    return is_connection_failure(error)


def mcp_error_is_transient(error: BaseException) -> bool:
    """Whether an MCP operation that failed with ``error`` failed to reach its server (and
    may succeed once the server is back): the ``retry_if`` of MCP steps by default."""
    return is_connection_failure(error)
