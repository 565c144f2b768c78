"""A step's outcome in the log: committed once (:func:`checkpoint`), or read back, or, when
a write did not happen, what the position holds adopted (:func:`adopt_recorded`). User
steps (``_engine/step.py``) and the built-in steps of the durable waits (sleep, recv and
get_event, streams, approvals, wait_first) share it, so a built-in step is a
:class:`StepDefinition` too (:func:`builtin_step`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..._errors_codec import dumps_error
from ..._serialization import Codec
from ..._storage.rows import StepEffect, StepRow, StepWrite
from ...errors import CheckpointTooLargeError, StepInDoubtError, WorkflowDivergedError
from ...records import StepStatus, WorkflowStatus
from .context import OwnershipLost, StopReason, WorkflowContext
from .outcome import Outcome, step_outcome
from .ownership import stop_for
from .registry import RetryPolicy, StepDefinition


def where(ctx: WorkflowContext, seq: int, step: StepDefinition) -> str:
    """The place named in errors about a step's recorded outcome (user or built-in)."""
    return f"workflow {ctx.workflow_id!r} step {seq} ({step.name})"


def adopt_recorded(
    ctx: WorkflowContext, step: StepDefinition, seq: int, write: StepWrite
) -> Outcome:
    """After a log write that did not happen: continue with what the position holds, or stop.

    Only a PENDING workflow that this session still owns is continued; then the
    row at ``seq`` is this run's own earlier write (a retry whose first reply was
    lost), since no other session could write while this one owned it. Any other
    status stops the run before it does anything more: it never goes on from a
    log that another run has moved past.
    """
    if write.workflow_status is None:
        raise ctx.halt(StopReason.NOT_OWNER, OwnershipLost(ctx.workflow_id, "no longer exists"))
    if write.workflow_status is not WorkflowStatus.PENDING:
        raise stop_for(ctx, write.workflow_status)
    if not write.owned:
        raise stop_for(ctx, WorkflowStatus.PENDING)
    existing = write.existing
    if existing is None:  # the guard refused, yet the workflow is ours: look again
        raise ctx.halt(StopReason.NOT_OWNER, OwnershipLost(ctx.workflow_id))
    if existing.name != step.name:
        raise ctx.halt(
            StopReason.DIVERGED,
            WorkflowDivergedError(ctx.workflow_id, seq, existing.name, step.name),
        )
    if existing.status is StepStatus.PENDING:  # an intent without a result: it may have happened
        raise ctx.halt(StopReason.IN_DOUBT, StepInDoubtError(ctx.workflow_id, seq, step.name))
    return step_outcome(
        existing.status, existing.output, existing.error, step.result, where(ctx, seq, step)
    )


def checkpoint(
    ctx: WorkflowContext,
    step: StepDefinition,
    seq: int,
    outcome: Outcome,
    attempts: int,
    started_at: datetime,
    *,
    fresh: bool | None = None,
    effects: Sequence[StepEffect] = (),
) -> Outcome:
    """Commit a live step's outcome to the log; the one place a step is checkpointed.

    Returns the outcome the workflow must continue with: its own, or, when a
    retried write finds its first attempt recorded, that record. A value too large to
    store is the step's outcome too: its CheckpointTooLargeError is recorded (and raised)
    in its place, once, so that a replay raises it again and no run makes the value again
    (a tool's then reaches the model as an error result). Any other value that cannot be
    stored (not JSON, refused by Postgres) raises SerializationError and writes nothing;
    a database failure stops the run unfinished (PENDING). ``fresh`` (default: the step is
    idempotent) says that no row holds the position yet (no intent, no RETRYING row), for
    the cheapest write. ``effects`` (what the step's successful attempt asked for inside
    it) are written in the same transaction as a SUCCESS, and dropped with an error.
    """
    fresh = step.idempotent if fresh is None else fresh
    try:
        write = _record(ctx, step, seq, outcome, attempts, started_at, fresh, effects)
    except CheckpointTooLargeError as too_large:
        if outcome.error is not None:  # an error record is clipped: never too large
            raise
        outcome = Outcome(error=too_large)
        write = _record(ctx, step, seq, outcome, attempts, started_at, fresh)
    return outcome if write.written else adopt_recorded(ctx, step, seq, write)


def _record(
    ctx: WorkflowContext,
    step: StepDefinition,
    seq: int,
    outcome: Outcome,
    attempts: int,
    started_at: datetime,
    fresh: bool,
    effects: Sequence[StepEffect] = (),
) -> StepWrite:
    if outcome.error is None:
        output = step.result.dumps(outcome.value, where(ctx, seq, step))
        status, error = StepStatus.SUCCESS, None
    else:
        status, output, error = StepStatus.ERROR, None, dumps_error(outcome.error)
        effects = ()
    with ctx.noting_database_failures():
        return ctx.engine.db.steps.record(
            workflow_id=ctx.workflow_id,
            seq=seq,
            name=step.name,
            status=status,
            output=output,
            error=error,
            attempts=attempts,
            started_at=started_at,
            owner_key=ctx.engine.session_key,
            fresh=fresh,
            effects=effects,
        )


def _not_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("dbos_agent's built-in steps are not called through StepDefinition.fn")


def builtin_step(name: str, result: Codec) -> StepDefinition:
    """A StepDefinition for a built-in step, so the shared checkpoint/adopt code applies."""
    return StepDefinition(
        name=name, fn=_not_called, is_async=False, retry=RetryPolicy(), result=result
    )


def recorded(ctx: WorkflowContext, step: StepDefinition, seq: int, row: StepRow) -> Outcome:
    """The outcome a built-in step recorded at ``seq`` (replay)."""
    return step_outcome(row.status, row.output, row.error, step.result, where(ctx, seq, step))
