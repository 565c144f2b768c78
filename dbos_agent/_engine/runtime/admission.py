"""Admission: a workflow call recorded (or found recorded), and who runs it.

Idempotent start lives here: a new id is one :class:`NewWorkflow` from the call to the
statement that inserts it; an id taken already is the same call (else a conflict) and
is attached to, waited for, taken over, answered from its outcome, or, held DIVERGED,
taken by code that may fit its log. The engine (``core.py``) then runs what was admitted
to run here.
"""

from __future__ import annotations

from typing import Any

from ..._limits import check_identifier
from ..._storage.rows import NewWorkflow
from ..._storage.session import end_dead_local_sessions
from ...errors import NotLaunchedError
from ...records import WorkflowStatus
from .context import current_context, current_workflow_id, current_workflow_timeout
from .core import Engine
from .outcome import Outcome, held_error, stored_outcome, workflow_outcome
from .registry import WorkflowDefinition
from .runs import Admission, SameCall, WorkflowRun, check_same_call, check_same_function


def admit(
    engine: Engine,
    definition: WorkflowDefinition,
    workflow_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    queue_name: str | None = None,
    priority: int = 0,
    dedup_id: str | None = None,
    delay: float | None = None,
    recorded_start: bool = False,
    partition_key: str | None = None,
) -> Admission:
    """Record the call (or find it recorded) and decide who runs it.

    A new id is inserted PENDING and run by the caller (or ENQUEUED when
    ``queue_name`` is given, for a worker to run; or, with ``delay``, recorded to
    start that many seconds from now, holding no thread). A finished one returns
    its recorded outcome. A pending one running here is attached to; one
    whose session is alive elsewhere is waited for; one whose session is
    gone is taken over and continued from its log by the caller. Another
    function or other inputs under the id raise :class:`WorkflowIdConflictError`; but a
    child whose start the parent's log recorded (``recorded_start``) is that child whatever
    inputs the replayed body computed.
    """
    if engine.stopping:
        raise NotLaunchedError("the dbos_agent engine is shutting down")
    check_identifier(workflow_id, "workflow id")
    inputs = definition.inputs.dumps(args, kwargs)
    same = check_same_call if not recorded_start else check_same_function
    if engine.replay_only:
        return _admit_replayed(engine, definition, workflow_id)
    new = NewWorkflow(
        workflow_id=workflow_id,
        name=definition.name,
        inputs=inputs,
        executor_id=engine.executor_id,
        app_version=engine.app_version,
        max_recovery_attempts=definition.max_recovery_attempts,
        owner_key=engine.session_key,
        queue_name=queue_name,
        priority=priority,
        parent_id=current_workflow_id(),
        timeout=current_workflow_timeout(),
        dedup_id=dedup_id,
        delay=delay,
        partition_key=partition_key,
    )
    if new.status is not WorkflowStatus.PENDING:
        return _enqueue(engine, definition, new, same)
    run = WorkflowRun(definition, workflow_id, args, kwargs, {})
    active = engine.runs.claim(run, inputs)
    if active is not None:
        same(workflow_id, definition.name, inputs, active.name, active.inputs)
        return Admission(attached=active.future)
    try:
        run.owned_streak = engine.ownership_mark()
        inserted, row = engine.db.workflows.insert(new)
        if inserted:
            return Admission(run=run)
        same(workflow_id, definition.name, inputs, row.name, row.inputs)
        if row.status.finished:
            outcome = stored_outcome(
                workflow_id, row.status, row.output, row.error, definition.result
            )
            engine.endings.resolve(run, outcome)
            return Admission(finished=outcome)
        if row.status is WorkflowStatus.DIVERGED:
            return _admit_diverged(engine, run)
        pending = row.status is WorkflowStatus.PENDING
        mine = pending and row.owner_key == engine.session_key
        if not mine:
            run.owned_streak = engine.ownership_mark()
            if pending and row.owner_live:  # a dead process here is declared dead now
                end_dead_local_sessions(engine.db)
        # the take-over is guarded on the owner's session being dead, whoever (recovery
        # in this process, another one) found it dead since the row was read
        if mine or (
            pending
            and engine.session_key is not None
            and engine.db.workflows.take_over(
                workflow_id, row.owner_key, engine.session_key, engine.executor_id
            )
        ):
            # registered before the row was read: no other run here has it since
            run.recorded = engine.db.steps.load(workflow_id)
            return Admission(run=run)
        engine.endings.resolve(run, Outcome())  # not ours to run: stop tracking it here
        return Admission(remote=True)
    except Exception as exc:
        engine.endings.resolve(run, Outcome(error=exc))
        raise
    except BaseException as exc:
        engine.endings.abandon(run, exc)
        raise


def _admit_replayed(engine: Engine, definition: WorkflowDefinition, workflow_id: str) -> Admission:
    """A workflow call met by a replay check (a child started, called or enqueued
    by the replayed body): what the live run would find, read without writing. A call
    not recorded yet is where the live run would do something new: the check stops."""
    info = engine.db.workflows.get(workflow_id)
    if info is None:
        ctx = current_context()
        assert ctx is not None, "a replay check calls workflows from replayed bodies"
        raise ctx.stop_past_log()
    if info.status.finished:
        return Admission(
            finished=workflow_outcome(
                workflow_id, info.status, info.output, info.error, definition.result
            )
        )
    return Admission(remote=True)


def _admit_diverged(engine: Engine, run: WorkflowRun) -> Admission:
    """A direct call of a DIVERGED workflow: this session takes it if its code may fit
    the log (a fixed deploy) and runs it; else the call gets the divergence."""
    run.owned_streak = engine.ownership_mark()
    if engine.session_key is not None and engine.db.workflows.take_diverged(
        run.workflow_id, engine.session_key, engine.executor_id, engine.runner()
    ):
        run.recorded = engine.db.steps.load(run.workflow_id)
        return Admission(run=run)
    info = engine.db.workflows.get(run.workflow_id)
    raise held_error(run.workflow_id, None if info is None else info.diverged)


def _enqueue(
    engine: Engine, definition: WorkflowDefinition, new: NewWorkflow, same: SameCall
) -> Admission:
    """Record a call ENQUEUED, or delayed (or find it recorded): a dispatcher or the
    waker runs it, never the caller, so the call takes no place in this process's run
    table (where it would hide the workflow from the dispatcher that dequeues it
    meanwhile)."""
    inserted, row = engine.db.workflows.insert(new)
    if inserted:
        if new.queue_name is None:  # a timer: the waker sleeps until the earliest one
            engine.note_suspended(new.delay)
        return Admission(remote=True)
    same(new.workflow_id, definition.name, new.inputs, row.name, row.inputs)
    if row.status.finished:
        return Admission(
            finished=stored_outcome(
                new.workflow_id, row.status, row.output, row.error, definition.result
            )
        )
    return Admission(remote=True)
