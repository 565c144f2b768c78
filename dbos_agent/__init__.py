"""dbos_agent: durable execution for AI agents (and any long, side-effecting Python) on Postgres.

Decorate the loop with :func:`durable_workflow` and the expensive or
side-effecting calls with :func:`step`; call :func:`launch` once. Every step's
outcome is committed to Postgres before the workflow moves on, and after a
crash the next :func:`launch` replays the recorded steps and continues live.

The top level is what a workflow body and a program's start-up write (``__all__`` below,
by role, capped by a test); the rest has a module of its own:

* :mod:`dbos_agent.aio`: the async forms of the workflow calls, same names (``aio.sleep``).
* :mod:`dbos_agent.operations`: the operator's actions from a launched process (cancel,
  resume, fork, approve, schedules, garbage collection); :class:`Client` has them too.
* :mod:`dbos_agent.errors`: every error (the few caught most are here as well).
* :mod:`dbos_agent.records`: what is recorded about workflows, steps, waits and schedules.

A call listed for workflows only raises ``NotInWorkflowError`` elsewhere. The names that
lived here before keep working for one release, with a ``DeprecationWarning`` naming
their new path.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from . import _moved
from . import aio as aio
from . import errors as errors
from . import operations as operations
from . import records as records
from ._engine.approvals import (
    Approval,
    ApprovalTicket,
    ask_approval,
    request_approval,
    wait_for_approval,
)
from ._engine.client import Client, ClientHandle
from ._engine.first import wait_first
from ._engine.handle import WorkflowHandle, retrieve
from ._engine.launch import Runtime, current_runtime, launch
from ._engine.launch_options import LaunchOptions
from ._engine.messaging import get_event, recv, send, send_bulk, set_event
from ._engine.patches import deprecate_patch, patched
from ._engine.queues import Queue
from ._engine.run_step import run_step
from ._engine.schedules import scheduled
from ._engine.step import NotDone, RetryPolicy, RunningStep, step, step_info, step_key
from ._engine.step_options import StepOptions
from ._engine.streams import StreamItem, close_stream, read_stream, write_stream
from ._engine.timers import sleep
from ._engine.workflow import (
    current_workflow_id,
    durable_workflow,
    start,
    workflow_id,
    workflow_timeout,
)
from .errors import (
    DatabaseUnavailableError,
    DbosAgentError,
    DependencyUnavailableError,
    WorkflowCancelledError,
    WorkflowNotFoundError,
    WorkflowTimeoutError,
)
from .records import WorkflowInfo, WorkflowStatus

__version__ = "0.1.0"

# Writing a workflow: the decorators, and what its code calls (only inside a workflow,
# or a step where it says so). Each call is recorded: a replay returns the recorded
# outcome. The async forms are in dbos_agent.aio under the same names.
__all__ = [
    "Approval",
    "ApprovalTicket",
    "NotDone",
    "RetryPolicy",
    "RunningStep",
    "StepOptions",
    "ask_approval",
    "close_stream",
    "current_workflow_id",
    "deprecate_patch",
    "durable_workflow",
    "patched",
    "recv",
    "request_approval",
    "retrieve",
    "run_step",
    "scheduled",
    "set_event",
    "sleep",
    "start",
    "step",
    "step_info",
    "step_key",
    "wait_first",
    "wait_for_approval",
    "workflow_id",
    "workflow_timeout",
    "write_stream",
]

# Inside a workflow or outside one: messages, events and streams (recorded as steps
# inside a workflow, plain calls outside).
__all__ += [
    "StreamItem",
    "get_event",
    "read_stream",
    "send",
    "send_bulk",
]

# Starting: the runtime, queues, a client by URL, the handles they return, and the
# workflow's status and record.
__all__ += [
    "Client",
    "ClientHandle",
    "LaunchOptions",
    "Queue",
    "Runtime",
    "WorkflowHandle",
    "WorkflowInfo",
    "WorkflowStatus",
    "current_runtime",
    "launch",
]

# The errors caught most (every one, these included, is in dbos_agent.errors).
__all__ += [
    "DatabaseUnavailableError",
    "DbosAgentError",
    "DependencyUnavailableError",
    "WorkflowCancelledError",
    "WorkflowNotFoundError",
    "WorkflowTimeoutError",
]

# The version of this package.
__all__ += [
    "__version__",
]

#: The public modules, listed by ``dir()`` beside ``__all__``.
_MODULES = ("aio", "errors", "operations", "records")

#: Names that left the top level, by their new module (the name is the same there, but
#: for the async forms, which drop their ``_async`` in dbos_agent.aio).
_MOVED_TO = {
    "aio": (
        "ask_approval_async",
        "close_stream_async",
        "get_event_async",
        "patched_async",
        "read_stream_async",
        "recv_async",
        "request_approval_async",
        "send_async",
        "set_event_async",
        "sleep_async",
        "wait_first_async",
        "wait_for_approval_async",
        "write_stream_async",
    ),
    "operations": operations.__all__,
    "records": (
        "Divergence",
        "RecoveryReport",
        "ScheduleInfo",
        "SlotOutcome",
        "StepInfo",
        "StepStatus",
        "WaitInfo",
    ),
    "errors": (
        "ApprovalError",
        "BudgetExceededError",
        "CheckpointError",
        "CheckpointTooLargeError",
        "ConfigurationError",
        "DatabaseClosedError",
        "DeployCheckError",
        "DuplicateEnqueueError",
        "InvalidDatabaseUrlError",
        "InvalidHistoryError",
        "InvalidIdentifierError",
        "InvalidOptionError",
        "MaxRecoveryAttemptsExceededError",
        "NotInStepError",
        "NotInWorkflowError",
        "NotLaunchedError",
        "PatchError",
        "QueueConflictError",
        "RecordedError",
        "ScheduleError",
        "ScheduleNotFoundError",
        "SchemaVersionError",
        "SerializationError",
        "StepInDoubtError",
        "StreamClosedError",
        "UnsupportedDatabaseError",
        "WorkflowDivergedError",
        "WorkflowIdConflictError",
        "WorkflowInputsError",
        "WorkflowInterruptedError",
        "WorkflowStatusError",
        "WriteRefusedError",
    ),
}
_MOVED = {
    old: (module, old.removesuffix("_async") if module == "aio" else old)
    for module, names in _MOVED_TO.items()
    for old in names
}


def __getattr__(name: str) -> Any:
    """The names that moved, for one release: the same object, with a DeprecationWarning
    that names where it lives now."""
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, new_name = moved
    on_client = module == "operations" and hasattr(Client, name)
    hint = f" (or Client.{name} from any process)" if on_client else ""
    warnings.warn(
        f"dbos_agent.{name} moved: use dbos_agent.{module}.{new_name}{hint}; "
        f"the old name goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"{__name__}.{module}"), new_name)


def __dir__() -> list[str]:
    return sorted([*__all__, *_MODULES])


_moved.install()  # the old paths of the modules that became private
