"""Suspension: a waiting workflow holds no thread, no task and no session.

A background run (one the worker pool runs: ``da.start``, recovery, a queue, a
wake-up) whose durable wait cannot be met within ``suspend_after`` seconds gives
its workflow up: one guarded statement makes it SUSPENDED, owned by nobody, with
what would wake it (a due time on the database clock, a message topic, another
workflow's event), unless that already happened. The run then ends like a run
that lost its workflow, and its thread goes back to the pool.

The waker of every launched process (``waking.py``) wakes suspended workflows
whose wait can be met: at once on the NOTIFY of a message or an event, when the earliest
timer is due, and by a sweep now and then (a lost NOTIFY, a restart). Waking is
one guarded statement too: the workflow becomes PENDING and owned by the waking
session, which runs it from its log. Replaying the steps before the wait costs
milliseconds; the wait then finds what it waited for.

Who may wake a workflow: any live process that knows its function by name and runs
its application version (as recovery). A process starting beside 100,000
suspended workflows wakes only those whose condition holds: recovery never claims
a SUSPENDED workflow.

Direct calls (``wf(x)`` in the caller's thread, ``await wf(x)``) never suspend:
their caller waits for them.
"""

from __future__ import annotations

from ..._storage.suspension import WaitCondition
from .context import StopReason, WorkflowContext
from .plans import Io, Plan


class Suspended(BaseException):
    """The run gave its workflow up to wait (SUSPENDED); a BaseException so that user
    code catching ``Exception`` does not swallow it, and the stop is noted besides."""

    def __init__(self, workflow_id: str, condition: WaitCondition) -> None:
        super().__init__(f"workflow {workflow_id!r} is suspended: it waits for {condition.kind}")
        self.condition = condition


def suspend_if_long(ctx: WorkflowContext, condition: WaitCondition, seconds: float) -> Plan[None]:
    """Suspend the run's workflow if it may and the wait is longer than the grace.

    Raises :class:`Suspended` (noted as the run's stop reason) once the workflow is
    SUSPENDED; returns when the run keeps waiting in memory (a short wait, a direct
    call, a step still running, or the wait could be met already).
    """
    if seconds <= ctx.engine.suspend_after or not ctx.may_suspend():
        return
    db = ctx.engine.db
    suspended = yield Io(
        lambda: db.suspension.suspend(ctx.workflow_id, condition, ctx.engine.session_key)
    )
    if suspended:
        ctx.engine.note_suspended(condition.wake_at)
        raise ctx.halt(StopReason.SUSPENDED, Suspended(ctx.workflow_id, condition))
