"""The durable agent: Anthropic model calls and tools as checkpointed steps.

Write the agent loop yourself, as a ``@durable_workflow``; this package gives it:

* :class:`Model`: ``messages.create`` / streaming as a step that records the whole
  ``Message`` and retries transient API failures (529, 429, 5xx, timeouts).
* :func:`tool` and :class:`ToolRegistry`: typed functions as tools (schema from the type
  hints) and steps; failures go back to the model as ``is_error`` results.
  ``ToolRegistry.from_mcp`` adds an MCP server's tools the same way (``mcp`` extra).
* :func:`usage_totals` and :func:`track_replay`: what a workflow cost, and what a recovery
  saved.

The hooks for replay-aware code of your own (``note_step``, ``replaying``...) stay in their
modules (:mod:`.replay`, :mod:`.model`, :mod:`.retrying`, :mod:`.budget`) and every error is
in :mod:`dbos_agent.errors`, so that ``__all__`` is what an agent's author writes; the names
that left it keep working for one release, with a ``DeprecationWarning``.

The scripted offline Messages API server lives in :mod:`dbos_agent.agent.scripted_server`.
Names are imported on first use, so that running that server (which needs no client) does
not pay for importing ``anthropic``. Only :mod:`.describe` (light: no client) is imported
at once: it registers how a recorded model step reads in the operator tools (``dbos-agent
workflows show``), which import this package for nothing else.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from . import describe  # noqa: F401  (registers how model steps read in `dbos-agent`)

if TYPE_CHECKING:
    from .accounting import DEFAULT_PRICES, Price, PriceTable, Usage, UsageTotals, usage_totals
    from .budget import Budget, Spend
    from .mcp import McpHttpServer, McpServer, McpTool
    from .model import DEFAULT_MODEL, Model, configure
    from .replay import ReplayReport, replay_report, track_replay
    from .retrying import ModelRetryPolicy
    from .tool_registry import ToolRegistry
    from .tools import Tool, ToolErrorResult, ToolOptions, tool

#: The public names, by the module that defines them (imported on first use).
_MODULES = {
    "budget": ("Budget", "Spend"),
    "accounting": ("DEFAULT_PRICES", "Price", "PriceTable", "Usage", "UsageTotals", "usage_totals"),
    "model": ("DEFAULT_MODEL", "Model", "configure"),
    "replay": ("ReplayReport", "replay_report", "track_replay"),
    "retrying": ("ModelRetryPolicy",),
    "tool_registry": ("ToolRegistry",),
    "mcp": ("McpHttpServer", "McpServer", "McpTool"),
    "tools": ("Tool", "ToolErrorResult", "ToolOptions", "tool"),
}
_WHERE = {name: f"{__name__}.{module}" for module, names in _MODULES.items() for name in names}

#: Names that left this package's ``__all__``, by the module that has them now.
_MOVED_TO = {
    f"{__name__}.budget": ("raise_budget",),
    f"{__name__}.model": ("MODEL_STEP_NAME", "default_async_client", "default_client"),
    f"{__name__}.replay": ("last_replay_report", "next_step_replays", "note_step", "replaying"),
    f"{__name__}.retrying": ("is_retryable", "retry_after_seconds"),
    "dbos_agent": ("NotDone",),
    "dbos_agent.errors": (
        "AsyncOnlyToolError",
        "McpConnectionError",
        "ToolCallRejected",
        "ToolInputError",
    ),
}
_MOVED = {name: module for module, names in _MOVED_TO.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None and name in _MOVED:
        module = _MOVED[name]
        warnings.warn(
            f"{__name__}.{name} moved: use {module}.{name}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_PRICES",
    "Budget",
    "McpHttpServer",
    "McpServer",
    "McpTool",
    "Model",
    "ModelRetryPolicy",
    "Price",
    "PriceTable",
    "ReplayReport",
    "Spend",
    "Tool",
    "ToolErrorResult",
    "ToolOptions",
    "ToolRegistry",
    "Usage",
    "UsageTotals",
    "configure",
    "replay_report",
    "tool",
    "track_replay",
    "usage_totals",
]
