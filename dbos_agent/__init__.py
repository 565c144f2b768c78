"""dbos_agent: durable execution for AI agents (and any long, side-effecting Python) on Postgres.

Decorate the loop with :func:`durable_workflow` and the expensive or
side-effecting calls with :func:`step`; call :func:`launch` once. Every step's
outcome is committed to Postgres before the workflow moves on, and after a
crash the next :func:`launch` replays the recorded steps and continues live.
"""

from .engine.approvals import (
    Approval,
    ApprovalRequest,
    ApprovalTicket,
    approval_digest,
    approve,
    ask_approval,
    list_approvals,
    reject,
    request_approval,
    request_approval_async,
    wait_for_approval,
)
from .engine.client import Client, ClientHandle
from .engine.context import current_workflow_id, step_key, workflow_id, workflow_timeout
from .engine.handle import WorkflowHandle, retrieve
from .engine.launch import Runtime, current_runtime, launch
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
from .engine.registry import NotDone, RetryPolicy
from .engine.retention import GcReport, garbage_collect
from .engine.step import step
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
from .engine.workflow import durable_workflow, list_steps, list_workflows, start
from .errors import (
    ApprovalError,
    BudgetExceededError,
    CheckpointError,
    CheckpointTooLargeError,
    ConfigurationError,
    DatabaseUnavailableError,
    DbosAgentError,
    InvalidIdentifierError,
    MaxRecoveryAttemptsExceededError,
    NotInWorkflowError,
    NotLaunchedError,
    PatchError,
    RecordedError,
    SchemaVersionError,
    SerializationError,
    StepInDoubtError,
    StreamClosedError,
    WorkflowCancelledError,
    WorkflowDivergedError,
    WorkflowIdConflictError,
    WorkflowInputsError,
    WorkflowInterruptedError,
    WorkflowNotFoundError,
    WorkflowStatusError,
    WorkflowTimeoutError,
)
from .records import Divergence, StepInfo, StepStatus, WorkflowInfo, WorkflowStatus

__version__ = "0.1.0"

__all__ = [
    "Approval",
    "ApprovalError",
    "ApprovalRequest",
    "ApprovalTicket",
    "BudgetExceededError",
    "CheckpointError",
    "CheckpointTooLargeError",
    "Client",
    "ClientHandle",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "DbosAgentError",
    "Divergence",
    "GcReport",
    "InvalidIdentifierError",
    "MaxRecoveryAttemptsExceededError",
    "NotDone",
    "NotInWorkflowError",
    "NotLaunchedError",
    "PatchError",
    "Queue",
    "RecordedError",
    "RetryPolicy",
    "Runtime",
    "SchemaVersionError",
    "SerializationError",
    "StepInDoubtError",
    "StepInfo",
    "StepStatus",
    "StreamClosedError",
    "StreamItem",
    "WorkflowCancelledError",
    "WorkflowDivergedError",
    "WorkflowHandle",
    "WorkflowIdConflictError",
    "WorkflowInfo",
    "WorkflowInputsError",
    "WorkflowInterruptedError",
    "WorkflowNotFoundError",
    "WorkflowStatus",
    "WorkflowStatusError",
    "WorkflowTimeoutError",
    "__version__",
    "approval_digest",
    "approve",
    "ask_approval",
    "cancel",
    "close_stream",
    "close_stream_async",
    "current_runtime",
    "current_workflow_id",
    "deprecate_patch",
    "durable_workflow",
    "fork",
    "garbage_collect",
    "get_event",
    "get_event_async",
    "launch",
    "list_approvals",
    "list_steps",
    "list_workflows",
    "patched",
    "patched_async",
    "read_stream",
    "read_stream_async",
    "recv",
    "recv_async",
    "reject",
    "request_approval",
    "request_approval_async",
    "resolve_in_doubt",
    "resume",
    "retrieve",
    "send",
    "send_async",
    "set_event",
    "set_event_async",
    "sleep",
    "sleep_async",
    "start",
    "step",
    "step_key",
    "wait_for_approval",
    "workflow_id",
    "workflow_timeout",
    "write_stream",
    "write_stream_async",
]
