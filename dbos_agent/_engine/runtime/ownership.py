"""Where ownership is checked: a run starts a live step only while its session owns the
workflow and the workflow is PENDING.

Writes are guarded in the database (every log write names the owning session, see
``write_status`` in the schema). What the database cannot guard is a side effect
that happens *before* the next write: a step's own code. So before each live step
the run asks its session's fence (``_storage/session.py``): when the run confirmed
its ownership in the current streak and the fence holds, nobody can have taken the
workflow, and the step starts at no cost. Otherwise (a pause past the lease, a
reconnect, an outage) the session is renewed and the workflow's owner read again:
a run that lost its workflow stops before the step, whatever the workflow's status.
"""

from __future__ import annotations

import time

from ...errors import WorkflowCancelledError
from ...records import WorkflowStatus
from .context import OwnershipLost, RuntimeStopping, StopReason, WorkflowContext


def owns_now(ctx: WorkflowContext) -> bool:
    """The fast path: confirmed in this streak, and the fence still holds."""
    fence = ctx.engine.session.state
    return ctx.owned_streak == fence.streak and time.monotonic() < fence.valid_until


def ensure_owned(ctx: WorkflowContext) -> None:
    """Return when the run may start a live step; raise (noting why) when it must stop.

    Blocks through a database outage, up to its bound (DatabaseUnavailableError).
    """
    if owns_now(ctx):
        return
    engine = ctx.engine
    with ctx.noting_database_failures():
        while True:
            if engine.stopping:
                raise RuntimeStopping()
            fence = engine.session.confirm(stop=lambda: engine.stopping)
            found = engine.db.workflows.owner(ctx.workflow_id)
            if found is None:
                raise ctx.halt(
                    StopReason.NOT_OWNER, OwnershipLost(ctx.workflow_id, "no longer exists")
                )
            status, owner = found
            if status is WorkflowStatus.PENDING and owner == engine.session.key:
                if engine.session.state.streak == fence.streak:
                    ctx.owned_streak = fence.streak
                    return
                continue  # the session lapsed while we looked: look again
            raise stop_for(ctx, status)


def stop_for(ctx: WorkflowContext, status: WorkflowStatus) -> BaseException:
    """Note and return why a run whose workflow is not (or no longer) its own must stop."""
    if status is WorkflowStatus.CANCELLED:
        return ctx.halt(
            StopReason.CANCELLED,
            WorkflowCancelledError(f"workflow {ctx.workflow_id!r} was cancelled"),
        )
    if status is WorkflowStatus.PENDING:
        return ctx.halt(StopReason.NOT_OWNER, OwnershipLost(ctx.workflow_id))
    return ctx.halt(
        StopReason.NOT_OWNER,
        OwnershipLost(ctx.workflow_id, f"is {status} already (finished elsewhere)"),
    )
