"""The durable agent: Anthropic model calls and tools as checkpointed steps.

Write the agent loop yourself, as a ``@durable_workflow``; this package gives it:

* :class:`Model`: ``messages.create`` / streaming as a step that records the whole
  ``Message`` and retries transient API failures (529, 429, 5xx, timeouts).
* :func:`tool` and :class:`ToolRegistry`: typed functions as tools (schema from the type
  hints) and steps; failures go back to the model as ``is_error`` results.
  ``ToolRegistry.from_mcp`` adds an MCP server's tools the same way (``mcp`` extra).
* :func:`usage_totals` and :func:`track_replay`: what a workflow cost, and what a recovery
  saved.

The scripted offline Messages API server lives in :mod:`dbos_agent.agent.scripted_server`.
Names are imported on first use, so that running that server (which needs no client) does
not pay for importing ``anthropic``. Only :mod:`.describe` (light: no client) is imported
at once: it registers how a recorded model step reads in the operator tools (``dbos-agent
workflows show``), which import this package for nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import describe  # noqa: F401  (registers how model steps read in `dbos-agent`)

if TYPE_CHECKING:
    from .accounting import DEFAULT_PRICES, Price, PriceTable, Usage, UsageTotals, usage_totals
    from .budget import Budget, Spend, raise_budget
    from .mcp import AsyncOnlyToolError, McpConnectionError, McpHttpServer, McpServer, McpTool
    from .model import (
        DEFAULT_MODEL,
        MODEL_STEP_NAME,
        Model,
        configure,
        default_async_client,
        default_client,
    )
    from .replay import (
        ReplayReport,
        last_replay_report,
        next_step_replays,
        note_step,
        replay_report,
        replaying,
        track_replay,
    )
    from .retrying import ModelRetryPolicy, is_retryable, retry_after_seconds
    from .tool_registry import ToolRegistry
    from .tools import (
        NotDone,
        Tool,
        ToolCallRejected,
        ToolErrorResult,
        ToolInputError,
        ToolOptions,
        tool,
    )

_MODULES = {
    "budget": ("Budget", "Spend", "raise_budget"),
    "accounting": ("DEFAULT_PRICES", "Price", "PriceTable", "Usage", "UsageTotals", "usage_totals"),
    "model": (
        "DEFAULT_MODEL",
        "MODEL_STEP_NAME",
        "Model",
        "configure",
        "default_async_client",
        "default_client",
    ),
    "replay": (
        "ReplayReport",
        "last_replay_report",
        "next_step_replays",
        "note_step",
        "replay_report",
        "replaying",
        "track_replay",
    ),
    "retrying": ("ModelRetryPolicy", "is_retryable", "retry_after_seconds"),
    "tool_registry": ("ToolRegistry",),
    "mcp": ("AsyncOnlyToolError", "McpConnectionError", "McpHttpServer", "McpServer", "McpTool"),
    "tools": (
        "NotDone",
        "Tool",
        "ToolCallRejected",
        "ToolErrorResult",
        "ToolInputError",
        "ToolOptions",
        "tool",
    ),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_PRICES",
    "MODEL_STEP_NAME",
    "AsyncOnlyToolError",
    "Budget",
    "McpConnectionError",
    "McpHttpServer",
    "McpServer",
    "McpTool",
    "Model",
    "ModelRetryPolicy",
    "NotDone",
    "Price",
    "PriceTable",
    "ReplayReport",
    "Spend",
    "Tool",
    "ToolCallRejected",
    "ToolErrorResult",
    "ToolInputError",
    "ToolOptions",
    "ToolRegistry",
    "Usage",
    "UsageTotals",
    "configure",
    "default_async_client",
    "default_client",
    "is_retryable",
    "last_replay_report",
    "next_step_replays",
    "note_step",
    "raise_budget",
    "replay_report",
    "replaying",
    "retry_after_seconds",
    "tool",
    "track_replay",
    "usage_totals",
]
