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
non-idempotent MCP call waits out only a failure to connect (:func:`mcp_connect_failed`:
the server's process did not start, the handshake timed out), which happens before its
request is sent, unless its options say otherwise: once sent, Pydantic AI's MCP client
cannot say whether a failed call reached the server, and it must not run twice.
"""

from __future__ import annotations

from types import TracebackType
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


def mcp_connect_failed(error: BaseException) -> bool:
    """Whether an MCP operation failed to reach its server before sending anything: a
    connection failure raised while Pydantic AI's MCP client was connecting (the server's
    process starting, the session's handshake), inside the server's ``__aenter__``, which
    a call enters before it sends its request. The ``retry_if`` of non-idempotent calls
    by default: a call that failed so was never sent, and is tried again once the server
    is back (a crash of the process that ran the call's step leaves nothing connected, so
    its first live call after a recovery connects)."""
    return is_connection_failure(error) and _raised_connecting(error)


def _raised_connecting(error: BaseException) -> bool:
    """Whether ``error`` (each member, for a group) was raised inside the ``__aenter__``
    of Pydantic AI's MCP server: its traceback, from where it was caught down to where it
    was raised, passes through that method (which sends no request of its callers)."""
    if isinstance(error, BaseExceptionGroup):
        return all(_raised_connecting(member) for member in error.exceptions)
    return _entering(error.__traceback__)


def _entering(tb: TracebackType | None) -> bool:
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__aenter__" and frame.f_globals.get("__name__") == _MCP:
            return True
        tb = tb.tb_next
    return False


#: The module of Pydantic AI's MCP client (its ``MCPServer.__aenter__`` connects).
_MCP = "pydantic_ai.mcp"
