"""An outcome is a value or an exception: what a step or a workflow produced."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..._errors_codec import error_from_json, loads_error
from ..._serialization import Codec
from ...errors import (
    MaxRecoveryAttemptsExceededError,
    WorkflowCancelledError,
    WorkflowDivergedError,
)
from ...records import Divergence, StepStatus, WorkflowStatus


@dataclass(slots=True)
class Outcome:
    """Either ``value`` or ``error``; :meth:`unwrap` returns the one or raises the other."""

    value: Any = None
    error: BaseException | None = None

    def unwrap(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def capture(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """Run ``fn`` and keep what it returned or raised (``Exception`` only)."""
    try:
        return Outcome(value=fn(*args, **kwargs))
    except Exception as exc:
        return Outcome(error=exc)


async def capture_async(awaitable: Awaitable[Any]) -> Outcome:
    """Await and keep what came back or was raised (``Exception`` only)."""
    try:
        return Outcome(value=await awaitable)
    except Exception as exc:
        return Outcome(error=exc)


def step_outcome(
    status: StepStatus, output: str | None, error: str | None, codec: Codec, where: str
) -> Outcome:
    """Rebuild a recorded step's outcome, typed through the step's return codec."""
    if status is StepStatus.SUCCESS:
        return Outcome(value=codec.loads(output if output is not None else "null", where))
    return Outcome(error=loads_error(error or "{}"))


def stored_outcome(
    workflow_id: str,
    status: WorkflowStatus,
    output: str | None,
    error: str | None,
    codec: Codec | None,
) -> Outcome:
    """:func:`workflow_outcome` from the stored JSON texts of a finished workflow."""
    return workflow_outcome(
        workflow_id,
        status,
        None if output is None else json.loads(output),
        None if error is None else json.loads(error),
        codec,
    )


def workflow_outcome(
    workflow_id: str,
    status: WorkflowStatus,
    output: Any,
    error: dict[str, Any] | None,
    codec: Codec | None,
) -> Outcome:
    """Rebuild a finished workflow's outcome from its stored (parsed) JSON.

    The result is typed through ``codec`` when this process knows the function,
    and plain JSON data otherwise.
    """
    if status is WorkflowStatus.SUCCESS:
        where = f"workflow {workflow_id!r} result"
        return Outcome(value=codec.from_jsonable(output, where) if codec else output)
    if status is WorkflowStatus.CANCELLED:  # what the cancel recorded (a deadline, a parent)
        recorded = error_from_json(error) if error else None
        if isinstance(recorded, WorkflowCancelledError):
            return Outcome(error=recorded)
        return Outcome(error=WorkflowCancelledError(f"workflow {workflow_id!r} was cancelled"))
    if status is WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED:
        detail = str((error or {}).get("message") or workflow_id)
        return Outcome(error=MaxRecoveryAttemptsExceededError(detail))
    return Outcome(error=error_from_json(error or {}))


def held_error(workflow_id: str, divergence: Divergence | None) -> WorkflowDivergedError:
    """What a direct call of a DIVERGED workflow gets when this process cannot continue
    it: the divergence (the workflow itself stays held, unfinished)."""
    if divergence is None:
        return WorkflowDivergedError(workflow_id, -1, "?", "?")
    return WorkflowDivergedError(
        workflow_id, divergence.position, divergence.recorded, divergence.called
    )
