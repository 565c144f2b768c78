"""Where the running workflow and step are kept: context variables.

Context variables follow ``asyncio`` tasks and ``contextvars.copy_context()``,
so steps find their workflow without any argument threading through user code.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import (
    CheckpointError,
    DbosAgentError,
    StepInDoubtError,
    WorkflowCancelledError,
    WorkflowDivergedError,
)
from ..storage.database import StepRow

if TYPE_CHECKING:
    from .runtime import Runtime


class RuntimeStopping(BaseException):
    """Raised at a step boundary while the runtime shuts down.

    A BaseException so that user code catching ``Exception`` does not swallow
    it; the workflow stays PENDING and is recovered by the next process.
    """


class OwnershipLost(BaseException):
    """Another executor session took this workflow over; this run stops quietly.

    The new owner runs it from the log; nothing is recorded by the old one.
    """

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"workflow {workflow_id!r} was taken over by another executor session")


@dataclass(eq=False)
class WorkflowContext:
    """The state of one workflow execution in this process."""

    workflow_id: str
    runtime: Runtime
    recorded: dict[int, StepRow]
    diverged: WorkflowDivergedError | None = None
    in_doubt: StepInDoubtError | None = None
    #: The log could not be written: the run stops unfinished, for recovery.
    checkpoint_error: CheckpointError | None = None
    #: Set once this run learns the workflow was cancelled: no step starts after that.
    cancelled: WorkflowCancelledError | None = None
    _next_seq: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def noting_checkpoint_errors(self) -> Iterator[None]:
        """Remember a failed log write, so the run ends PENDING even if user code
        catches the error and carries on."""
        try:
            yield
        except CheckpointError as exc:
            self.checkpoint_error = exc
            raise

    def next_position(self) -> int:
        """Hand out the next step position (thread-safe: positions are call order)."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
        return seq

    def begin_step(self, name: str) -> tuple[int, StepRow | None]:
        """Take a position for step ``name``; return its recorded row when replaying."""
        if self.runtime.stopping:
            raise RuntimeStopping()
        if self.cancelled is None:
            self.cancelled = self.runtime.cancellation(self.workflow_id)
        if self.cancelled is not None:
            raise self.cancelled
        seq = self.next_position()
        recorded = self.recorded.pop(seq, None)
        if recorded is not None and recorded.name != name:
            self.diverged = WorkflowDivergedError(self.workflow_id, seq, recorded.name, name)
            raise self.diverged
        return seq, recorded

    def child_workflow_id(self) -> str:
        """A deterministic id for a workflow started from this one (same on replay)."""
        return f"{self.workflow_id}-{self.next_position()}"


_current_workflow: ContextVar[WorkflowContext | None] = ContextVar(
    "dbos_agent_workflow", default=None
)
_current_step: ContextVar[int | None] = ContextVar("dbos_agent_step", default=None)
_assigned_workflow_id: ContextVar[str | None] = ContextVar(
    "dbos_agent_assigned_workflow_id", default=None
)


def current_context() -> WorkflowContext | None:
    """The workflow running in this context, if any."""
    return _current_workflow.get()


def in_step() -> bool:
    """True while a step function is executing (nested steps then run plainly)."""
    return _current_step.get() is not None


@contextmanager
def entered_workflow(ctx: WorkflowContext) -> Iterator[WorkflowContext]:
    """Make ``ctx`` the current workflow (and no step current) for the block."""
    wf_token = _current_workflow.set(ctx)
    step_token = _current_step.set(None)
    try:
        yield ctx
    finally:
        _current_step.reset(step_token)
        _current_workflow.reset(wf_token)


@contextmanager
def entered_step(seq: int) -> Iterator[None]:
    """Mark step ``seq`` as executing for the block."""
    token = _current_step.set(seq)
    try:
        yield
    finally:
        _current_step.reset(token)


def current_workflow_id() -> str | None:
    """The id of the workflow running here, or None outside any workflow."""
    ctx = _current_workflow.get()
    return ctx.workflow_id if ctx else None


def step_key() -> str:
    """A stable idempotency key for the running step: the same on every replay.

    Pass it to external APIs (e.g. an ``Idempotency-Key`` header) so that a
    step re-run after a crash is deduplicated by the receiving side.
    """
    ctx = _current_workflow.get()
    seq = _current_step.get()
    if ctx is None or seq is None:
        raise DbosAgentError("step_key() is only available inside a step of a durable workflow")
    return f"{ctx.workflow_id}:{seq}"


@contextmanager
def workflow_id(value: str) -> Iterator[None]:
    """Run the durable workflows called in this block under the id ``value``.

    A second call with the same id returns the recorded result and runs nothing.
    """
    if not isinstance(value, str) or not value:
        raise ValueError("a workflow id must be a non-empty string")
    token = _assigned_workflow_id.set(value)
    try:
        yield
    finally:
        _assigned_workflow_id.reset(token)


def take_workflow_id(explicit: str | None = None) -> str:
    """The id for a new top-level workflow: explicit, assigned by the block, or fresh."""
    return explicit or _assigned_workflow_id.get() or str(uuid.uuid4())
