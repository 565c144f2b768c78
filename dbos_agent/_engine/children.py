"""The id of a workflow started from a workflow: a recorded step of the parent.

A parent may start a child (a direct call, ``da.start``, ``Queue.enqueue``) under an id
its body computes: given, set by ``with da.workflow_id(...)``, made up (``uuid4()``) or
derived from the parent. Whatever the body computes, the id the live run chose is
recorded as the step ``dbos_agent.start_child`` *before* the child is admitted, and a
replay gets that recorded id back: a parent woken ten times starts its child once, and
an id the body makes up differently on each run never starts a second child. A recorded
start is the recorded child whatever inputs the replayed body computes (uuid4(), the
time): as in DBOS, the child under the id is not checked against them.

An enqueue refused for its deduplication id (DuplicateEnqueueError) records the refusal as
the step ``dbos_agent.enqueue_refused`` right after the start: a replay raises it again,
even once the id is free, instead of enqueuing a child the first run never had.

Logs recorded before this step existed are read as the old code wrote them: a direct
call or ``da.start`` without an explicit id took a position and recorded nothing there
(its child is ``<parent>-<position>``); an explicit id or an enqueue took no position.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

from .._limits import derived_identifier
from .._serialization import codec_for
from ..errors import DuplicateEnqueueError
from .runtime.checkpoints import builtin_step, checkpoint, recorded
from .runtime.context import (
    WorkflowContext,
    assigned_workflow_id,
    current_context,
    in_step,
    take_workflow_id,
)
from .runtime.outcome import Outcome
from .runtime.plans import Io, Plan, run_plan, run_plan_async

#: The step that records the id of a workflow started from a workflow.
START_CHILD_STEP = "dbos_agent.start_child"

_START_CHILD = builtin_step(START_CHILD_STEP, codec_for(str))

#: The step that records an enqueue refused for its deduplication id.
ENQUEUE_REFUSED_STEP = "dbos_agent.enqueue_refused"

_ENQUEUE_REFUSED = builtin_step(ENQUEUE_REFUSED_STEP, codec_for(str))


class ChildStart(NamedTuple):
    """The id a workflow starts under, and whether the parent's log recorded the start (a
    replay: the workflow under the id is the child, whatever its inputs are now)."""

    workflow_id: str
    recorded: bool = False


def _child_plan(ctx: WorkflowContext, explicit: str | None, *, enqueue: bool) -> Plan[ChildStart]:
    row = ctx.next_recorded()
    if row is None and not ctx.live_from_here():
        # A position that recorded nothing, inside the log: old code's direct start.
        if explicit is None and not enqueue:
            return ChildStart(derived_identifier(ctx.workflow_id, f"-{ctx.next_position()}"))
        return ChildStart(take_workflow_id(explicit))
    if row is not None and row.name != START_CHILD_STEP and (explicit is not None or enqueue):
        return ChildStart(take_workflow_id(explicit))  # old code's start without a position
    seq, row = ctx.begin_step(START_CHILD_STEP)
    if row is not None:
        return ChildStart(str(recorded(ctx, _START_CHILD, seq, row).unwrap()), recorded=True)
    if explicit is not None or assigned_workflow_id() is not None:
        child_id = take_workflow_id(explicit)
    else:
        child_id = derived_identifier(ctx.workflow_id, f"-{seq}")
    done = yield Io(
        lambda: checkpoint(ctx, _START_CHILD, seq, Outcome(child_id), 1, datetime.now(UTC))
    )
    return ChildStart(str(done.unwrap()))


def _parent() -> WorkflowContext | None:
    ctx = current_context()
    return ctx if ctx is not None and not in_step() else None


def workflow_id_for_start(explicit: str | None = None, *, enqueue: bool = False) -> ChildStart:
    """The id of a workflow started here: in a workflow, the recorded child id (see the
    module docstring); elsewhere, ``explicit``, the ``da.workflow_id`` block's or fresh."""
    ctx = _parent()
    if ctx is None:
        return ChildStart(take_workflow_id(explicit))
    return run_plan(_child_plan(ctx, explicit, enqueue=enqueue))


async def workflow_id_for_start_async(explicit: str | None = None) -> ChildStart:
    """:func:`workflow_id_for_start` for an async workflow's direct call of an async
    workflow (the record is written off the event loop)."""
    ctx = _parent()
    if ctx is None:
        return ChildStart(take_workflow_id(explicit))
    return await run_plan_async(_child_plan(ctx, explicit, enqueue=False))


def raise_recorded_refusal() -> None:
    """After an enqueue's start: raise the refusal the log recorded for it, if any."""
    ctx = _parent()
    if ctx is None:
        return
    row = ctx.next_recorded()
    if row is None or row.name != ENQUEUE_REFUSED_STEP:
        return
    seq, row = ctx.begin_step(ENQUEUE_REFUSED_STEP)
    assert row is not None
    recorded(ctx, _ENQUEUE_REFUSED, seq, row).unwrap()


def record_refusal(refused: DuplicateEnqueueError) -> None:
    """Record a live enqueue's refusal in the parent's log (outside a workflow: nothing)."""
    ctx = _parent()
    if ctx is None:
        return
    seq, row = ctx.begin_step(ENQUEUE_REFUSED_STEP)
    if row is None:
        checkpoint(ctx, _ENQUEUE_REFUSED, seq, Outcome(error=refused), 1, datetime.now(UTC))
