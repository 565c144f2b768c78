"""The options of a tool and of an MCP server, each made of a step's options and its own.

A tool's step takes every option ``@da.step`` takes (:class:`StepOptions`, said once in
the engine), with the same meaning and defaults: what a tool adds is only what the model
sees (``name``, ``description``) and ``requires_approval``; what an MCP server adds is
how the registry reaches it. Neither module that uses them needs the ``mcp`` extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from .._engine.extending import STEP_OPTIONS, StepOptions, check_known

__all__ = ["MCP_OWN", "TOOL_OWN", "McpOptions", "ToolOptions", "check_tool_options"]


class ToolOptions(StepOptions, total=False):
    """The options of a tool: ``@tool(...)`` and ``Tool(fn, ...)`` take them as keywords.

    Every option of :class:`StepOptions` (``@da.step``'s: retries, ``retry_if``,
    ``jitter``, ``retry_policy``, ``idempotent`` and ``guard``, ``timeout``,
    ``give_up_after``...) applies to the tool's step ``tool:<name>`` as it would to a
    ``@da.step``; one left out takes the step's default. An ``async def`` tool's
    ``timeout`` failure reaches the model as an ``is_error`` result, after its retries.
    """

    name: str | None
    """The name the model calls (default: the function's); the step is ``tool:<name>``."""
    description: str | None
    """What the model reads (default: the docstring without its ``Args:`` section)."""
    requires_approval: bool
    """A call the model asks for runs only once a human approved that exact call (tool and
    arguments, see ``da.request_approval``); a rejection goes back to the model as an
    ``is_error`` result with the human's reason."""


class McpOptions(StepOptions, total=False):
    """The options of an MCP server (``ToolRegistry.from_mcp`` and ``add_mcp``).

    Its :class:`StepOptions` and ``requires_approval`` apply to every tool of the server
    (``give_up_after`` defaults to 24 hours, ``waits_for`` to the server, ``timeout`` is
    each request's); ``tool_options`` gives one tool its own :class:`ToolOptions` over them.
    """

    requires_approval: bool
    """As a tool's: every call of the server's tools waits for a human's approval."""
    server_name: str | None
    """Names the listing step ``mcp:list_tools:<server_name>`` (default: the server
    script's name, or the URL's last path part or host)."""
    tool_options: Mapping[str, ToolOptions] | None
    """An MCP tool's name to its own options (``name`` renames it for the model)."""
    errlog: TextIO | None
    """Where a server the registry starts writes its stderr."""
    connect_timeout: float | None
    """Seconds to start the server and complete the handshake (default 30)."""
    request_timeout: float | None
    """Seconds a listing or a call may take when the tool has no ``timeout`` (default 300)."""
    reconnects: int
    """How often a broken connection is reopened per request (default 2)."""


#: The options that are a tool's own; every other one is its step's.
TOOL_OWN = frozenset({"name", "description", "requires_approval"})
#: The options that are an MCP server's own (how to reach it); the rest are its tools'.
MCP_OWN = McpOptions.__optional_keys__ - STEP_OPTIONS - {"requires_approval"}


def check_tool_options(options: Mapping[str, object], owner: str) -> None:
    """Refuse an option that is not one of :class:`ToolOptions`, naming it."""
    check_known(options, ToolOptions.__optional_keys__, owner)
