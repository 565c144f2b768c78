"""What the layers built on the engine may use of its machinery.

The agent layer keeps per-run state beside a workflow's context (its replay tracker, its
budget), runs parallel tool calls at reserved step positions, opens tracing spans
around model calls and makes retry policies of its own (its options checked as the
engine's are); tools and integrations take a step's options (``StepOptions``), checked and
layered as ``@da.step``'s are; the CLI, the worker and the replay checker list the
registered workflows. Those are the only doors into ``_engine/runtime/``: everything else there is
the engine's own, so it can change without the layers above noticing.
"""

from __future__ import annotations

from .runtime import tracing
from .runtime.context import (
    WorkflowContext,
    at_position,
    current_context,
    in_step,
    reserve_positions,
)
from .runtime.registry import (
    NotDone,
    RetryPolicy,
    StepDefinition,
    seconds_option,
    workflow_names,
)
from .step_options import STEP_OPTIONS, StepOptions, StepSettings, check_known, layered

__all__ = [
    "STEP_OPTIONS",
    "NotDone",
    "RetryPolicy",
    "StepDefinition",
    "StepOptions",
    "StepSettings",
    "WorkflowContext",
    "at_position",
    "check_known",
    "current_context",
    "in_step",
    "layered",
    "reserve_positions",
    "seconds_option",
    "tracing",
    "workflow_names",
]
