"""What the public waits (sleep, recv and get_event, streams, approvals, patches) check
before they do anything: that they are called from a workflow's body, and their seconds.
What they build on is the runtime's: built-in steps and their recorded outcomes
(``runtime/checkpoints.py``), a wait with a recorded deadline (``runtime/deadlines.py``).
"""

from __future__ import annotations

import math

from ..errors import NotInWorkflowError
from .runtime.context import Attempt, WorkflowContext, current_attempt, current_context, in_step


def workflow_only(what: str) -> WorkflowContext:
    """The running workflow, for operations that only make sense as one of its steps."""
    ctx = current_context()
    if ctx is None:
        raise NotInWorkflowError(f"{what} can only be called inside a durable workflow")
    if in_step():
        raise NotInWorkflowError(
            f"{what} cannot be called inside a step: a step may run again after a crash, "
            f"so call it from the workflow function itself"
        )
    return ctx


def step_attempt(what: str) -> Attempt:
    """The attempt of the step running here, for a write made with its checkpoint (not
    in a guard deciding an in-doubt step, which runs outside any attempt)."""
    attempt = current_attempt()
    if attempt is None:
        raise NotInWorkflowError(
            f"{what} cannot be called in a step's guard: call it from the step or the "
            f"workflow function"
        )
    return attempt


def check_seconds(seconds: float, what: str) -> float:
    """``seconds`` as a float, refused like ``time.sleep`` refuses it (and never infinite:
    a wake-up time must be storable)."""
    value = float(seconds)
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{what} must be a finite, non-negative number of seconds, got {seconds!r}"
        )
    return value
