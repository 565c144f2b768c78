"""dbos_agent: durable execution for AI agents (and any long, side-effecting Python) on Postgres.

Decorate the loop with :func:`durable_workflow` and the expensive or
side-effecting calls with :func:`step`; call :func:`launch` once. Every step's
outcome is committed to Postgres before the workflow moves on, and after a
crash the next :func:`launch` replays the recorded steps and continues live.

The names are flat (``da.step``, ``da.send``...); ``__all__`` below lists them by role:
what a workflow's own code calls, what starts and inspects workflows, what operators
do to them, and the errors. A call listed for workflows only raises
:class:`NotInWorkflowError` elsewhere.
"""

from .engine.approvals import (
    Approval,
    ApprovalRequest,
    ApprovalTicket,
    approval_digest,
    approve,
    ask_approval,
    ask_approval_async,
    list_approvals,
    reject,
    request_approval,
    request_approval_async,
    wait_for_approval,
    wait_for_approval_async,
)
from .engine.client import Client, ClientHandle
from .engine.first import wait_first, wait_first_async
from .engine.handle import WorkflowHandle, retrieve
from .engine.launch import Runtime, current_runtime, launch
from .engine.launch_options import LaunchOptions
from .engine.messaging import (
    get_event,
    get_event_async,
    recv,
    recv_async,
    send,
    send_async,
    set_event,
    set_event_async,
)
from .engine.operations import cancel, fork, resolve_in_doubt, resume
from .engine.patches import deprecate_patch, patched, patched_async
from .engine.queues import Queue
from .engine.retention import GcReport, garbage_collect
from .engine.schedules import (
    BackfillReport,
    backfill_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
    scheduled,
)
from .engine.step import NotDone, RetryPolicy, RunningStep, step, step_info, step_key
from .engine.streams import (
    StreamItem,
    close_stream,
    close_stream_async,
    read_stream,
    read_stream_async,
    write_stream,
    write_stream_async,
)
from .engine.timers import sleep, sleep_async
from .engine.workflow import (
    current_workflow_id,
    durable_workflow,
    list_steps,
    list_workflows,
    start,
    workflow_id,
    workflow_timeout,
)
from .errors import (
    ApprovalError,
    BudgetExceededError,
    CheckpointError,
    CheckpointTooLargeError,
    ConfigurationError,
    DatabaseClosedError,
    DatabaseUnavailableError,
    DbosAgentError,
    DependencyUnavailableError,
    DeployCheckError,
    DuplicateEnqueueError,
    InvalidDatabaseUrlError,
    InvalidHistoryError,
    InvalidIdentifierError,
    InvalidOptionError,
    MaxRecoveryAttemptsExceededError,
    NotInStepError,
    NotInWorkflowError,
    NotLaunchedError,
    PatchError,
    QueueConflictError,
    RecordedError,
    ScheduleError,
    ScheduleNotFoundError,
    SchemaVersionError,
    SerializationError,
    StepInDoubtError,
    StreamClosedError,
    UnsupportedDatabaseError,
    WorkflowCancelledError,
    WorkflowDivergedError,
    WorkflowIdConflictError,
    WorkflowInputsError,
    WorkflowInterruptedError,
    WorkflowNotFoundError,
    WorkflowStatusError,
    WorkflowTimeoutError,
    WriteRefusedError,
)
from .records import (
    Divergence,
    RecoveryReport,
    ScheduleInfo,
    SlotOutcome,
    StepInfo,
    StepStatus,
    WaitInfo,
    WorkflowInfo,
    WorkflowStatus,
)

__version__ = "0.1.0"

# Writing a workflow: the decorators, and what its code calls (only inside a
# workflow, or a step where it says so). Each call is recorded: a replay returns the
# recorded outcome. Pairs ``x``/``x_async`` are the same recorded step.
__all__ = [
    "Approval",
    "ApprovalTicket",
    "NotDone",
    "RetryPolicy",
    "RunningStep",
    "ask_approval",
    "ask_approval_async",
    "close_stream",
    "close_stream_async",
    "current_workflow_id",
    "deprecate_patch",
    "durable_workflow",
    "patched",
    "patched_async",
    "recv",
    "recv_async",
    "request_approval",
    "request_approval_async",
    "scheduled",
    "set_event",
    "set_event_async",
    "sleep",
    "sleep_async",
    "step",
    "step_info",
    "step_key",
    "wait_first",
    "wait_first_async",
    "wait_for_approval",
    "wait_for_approval_async",
    "write_stream",
    "write_stream_async",
]

# Inside a workflow or outside one: messages, events and streams (recorded as
# steps inside a workflow, plain calls outside).
__all__ += [
    "StreamItem",
    "get_event",
    "get_event_async",
    "read_stream",
    "read_stream_async",
    "send",
    "send_async",
]

# Starting and inspecting: the runtime, starting workflows (called, started,
# enqueued), their handles, and what is recorded about them.
__all__ += [
    "ApprovalRequest",
    "Client",
    "ClientHandle",
    "Divergence",
    "LaunchOptions",
    "Queue",
    "RecoveryReport",
    "Runtime",
    "ScheduleInfo",
    "SlotOutcome",
    "StepInfo",
    "StepStatus",
    "WaitInfo",
    "WorkflowHandle",
    "WorkflowInfo",
    "WorkflowStatus",
    "approval_digest",
    "current_runtime",
    "launch",
    "list_approvals",
    "list_schedules",
    "list_steps",
    "list_workflows",
    "retrieve",
    "start",
    "workflow_id",
    "workflow_timeout",
]

# Operating: acting on workflows from outside (also through Client, the CLI and
# the HTTP API).
__all__ += [
    "BackfillReport",
    "GcReport",
    "approve",
    "backfill_schedule",
    "cancel",
    "fork",
    "garbage_collect",
    "pause_schedule",
    "reject",
    "resolve_in_doubt",
    "resume",
    "resume_schedule",
]

# Errors: every one is a DbosAgentError.
__all__ += [
    "ApprovalError",
    "BudgetExceededError",
    "CheckpointError",
    "CheckpointTooLargeError",
    "ConfigurationError",
    "DatabaseClosedError",
    "DatabaseUnavailableError",
    "DbosAgentError",
    "DependencyUnavailableError",
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
    "WorkflowCancelledError",
    "WorkflowDivergedError",
    "WorkflowIdConflictError",
    "WorkflowInputsError",
    "WorkflowInterruptedError",
    "WorkflowNotFoundError",
    "WorkflowStatusError",
    "WorkflowTimeoutError",
    "WriteRefusedError",
]

# The version of this package.
__all__ += [
    "__version__",
]
