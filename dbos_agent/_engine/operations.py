"""Operator actions on stored workflows: cancel, resume, fork, rewind, retry now, resolve
an in-doubt step (edited forks and rewinds are checked in edits.py).

Each action comes in two layers. The functions taking a ``SystemDatabase``
work from the database alone: the CLI uses them, and it never has the user's
workflow functions. Each changes status and log in one guarded statement and
leaves the run to whichever process has the function (the executor's next
recovery, or any worker daemon: a workflow made PENDING without an owner is
claimable at once); ``Client`` has them as methods. The public functions of
``dbos_agent.operations`` (``cancel``, ``resume``, ``fork``, ``rewind``, ``resolve_in_doubt``) go
through the launched runtime and, when this process has the function, run the workflow
here right away.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from .._limits import check_identifier
from .._serialization import codec_for
from .._storage.database import SystemDatabase
from .._storage.rows import ForkResult, ResumeResult
from ..errors import (
    ForkEditError,
    WorkflowIdConflictError,
    WorkflowInputsError,
    WorkflowNotFoundError,
    WorkflowStatusError,
)
from ..records import StepStatus, WorkflowStatus
from .edits import ForkEdits, Replacements, check_edits, rewind_workflow
from .handle import WorkflowHandle
from .runtime.core import Engine
from .runtime.current import current_engine
from .runtime.outcome import Outcome
from .runtime.registry import WorkflowDefinition, find_workflow
from .runtime.runs import Claim

_UNSET: Any = object()

#: What each action accepts; the error messages say so.
CANCELLABLE = (
    WorkflowStatus.PENDING,
    WorkflowStatus.SUSPENDED,
    WorkflowStatus.ENQUEUED,
    WorkflowStatus.DIVERGED,
    WorkflowStatus.IN_DOUBT,
    WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED,
)
RESUMABLE = (
    WorkflowStatus.CANCELLED,
    WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    WorkflowStatus.DIVERGED,
)
#: What a rewind accepts: workflows no process runs (rewind_workflow in queries.sql).
REWINDABLE = (
    WorkflowStatus.SUCCESS,
    WorkflowStatus.ERROR,
    WorkflowStatus.CANCELLED,
    WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED,
    WorkflowStatus.DIVERGED,
    WorkflowStatus.IN_DOUBT,
    WorkflowStatus.SUSPENDED,
)


def _resolve_hint(workflow_id: str, seq: int) -> str:
    return (
        f"`dbos-agent steps resolve {workflow_id} {seq} --result JSON` (it happened) or "
        f"`--rerun` (it did not), or dbos_agent.operations.resolve_in_doubt(...)"
    )


# -- from the database alone (the CLI) ---------------------------------------------------


def cancel_workflow(db: SystemDatabase, workflow_id: str) -> WorkflowStatus:
    """Cancel a workflow in the database; return the status it had.

    Cancelling a CANCELLED workflow is a no-op (returns CANCELLED), so that
    scripts can retry. A finished one (SUCCESS, ERROR) raises
    :class:`WorkflowStatusError`: its outcome is recorded and stays.
    """
    result = db.operations.cancel(check_identifier(workflow_id, "workflow id"))
    if result is None:
        raise WorkflowNotFoundError(workflow_id)
    if not result.cancelled and result.previous is not WorkflowStatus.CANCELLED:
        raise WorkflowStatusError(
            workflow_id,
            result.previous,
            f"workflow {workflow_id!r} already finished with status {result.previous}; "
            f"only {', '.join(CANCELLABLE)} workflows can be cancelled",
        )
    return result.previous


def resume_workflow(
    db: SystemDatabase,
    workflow_id: str,
    *,
    executor_id: str | None = None,
    owner_key: int | None = None,
) -> ResumeResult:
    """Make a cancelled, dead-lettered or resolved in-doubt workflow PENDING again; start an
    ENQUEUED or delayed one now; leave a finished one as it is (``result.resumed`` False),
    as DBOS does.

    ``owner_key`` None leaves it to whichever process claims it;
    ``executor_id`` None keeps its executor.
    """
    check_identifier(workflow_id, "workflow id")
    result = db.operations.resume(workflow_id, executor_id=executor_id, owner_key=owner_key)
    if result is None:
        raise WorkflowNotFoundError(workflow_id)
    if result.resumed:
        return result
    status = result.previous
    if status is WorkflowStatus.IN_DOUBT and result.open_intent is not None:
        detail = (
            f"its step {result.open_intent} is still in doubt; resolve it with "
            f"{_resolve_hint(workflow_id, result.open_intent)}, which also resumes it"
        )
    elif status.finished:  # nothing to do: its handle answers with its outcome
        return result
    else:
        detail = "it has not stopped: it runs, or its executor recovers it"
    raise WorkflowStatusError(
        workflow_id, status, f"cannot resume workflow {workflow_id!r}: it is {status}; {detail}"
    )


def fork_workflow(
    db: SystemDatabase,
    workflow_id: str,
    from_step: int,
    *,
    new_workflow_id: str | None = None,
    executor_id: str | None = None,
    owner_key: int | None = None,
    edits: ForkEdits | None = None,
) -> tuple[str, ForkResult]:
    """Start a new workflow that reuses ``workflow_id``'s recorded steps below ``from_step``.

    Returns the new id and what was copied. What the original published below the fork
    point (events, stream items) is the fork's too. The fork point (``result.from_step``)
    is ``from_step`` moved back over the approval steps just below it, so that the fork
    asks for those approvals again rather than waiting for a decision nobody can give, or
    running the approved tool again on the original's decision. A ``from_step`` past the end
    of the log forks from its end (as DBOS does). Refused, writing nothing, when an earlier
    step is in doubt (the fork would silently repeat an effect that may have happened).
    ``edits`` (checked by :func:`~.edits.check_edits`) give it other inputs or step outputs;
    a replaced step that no longer fits the log (a concurrent rewind) raises ForkEditError.
    """
    if from_step < 0:
        raise ValueError(f"from_step must be >= 0, got {from_step}")
    check_identifier(workflow_id, "workflow id")
    new_id = (
        str(uuid.uuid4())
        if new_workflow_id is None
        else check_identifier(new_workflow_id, "new workflow id")
    )
    result = db.operations.fork(
        workflow_id,
        new_workflow_id=new_id,
        from_step=from_step,
        executor_id=executor_id,
        owner_key=owner_key,
        inputs=None if edits is None else edits.inputs,
        replace=None if edits is None else edits.replace,
        edits=None if edits is None else edits.records,
    )
    if result is None:
        raise WorkflowNotFoundError(workflow_id)
    if result.forked:
        return new_id, result
    status = _status(db, workflow_id)
    if result.bad_edit is not None and result.open_intent is None:
        raise ForkEditError(
            workflow_id,
            f"step {result.bad_edit}",
            f"it is no recorded result of that name below the fork point "
            f"{result.from_step} (any longer)",
        )
    if result.open_intent is not None:
        raise WorkflowStatusError(
            workflow_id,
            status,
            f"cannot fork workflow {workflow_id!r} from step {from_step}: its step "
            f"{result.open_intent} is in doubt; resolve it first with "
            f"{_resolve_hint(workflow_id, result.open_intent)}, or fork from step "
            f"{result.open_intent} or earlier to run it again on purpose",
        )
    end = 0 if result.last_seq is None else result.last_seq + 1
    if from_step > end:  # past the end of the log: from its end, as DBOS does
        return fork_workflow(
            db,
            workflow_id,
            end,
            new_workflow_id=new_id,
            executor_id=executor_id,
            owner_key=owner_key,
        )
    raise WorkflowIdConflictError(f"workflow id {new_id!r} is already taken")


def _status(db: SystemDatabase, workflow_id: str) -> WorkflowStatus:
    """The status of a workflow whose action was refused, for the error that says so."""
    found = db.workflows.owner(workflow_id)
    if found is None:
        raise WorkflowNotFoundError(workflow_id)
    return found[0]


def retry_workflow(db: SystemDatabase, workflow_id: str) -> int:
    """Make the next attempt of the workflow's steps that wait out a failing dependency
    (RETRYING, see runtime/retries.py) due now: a SUSPENDED one wakes in whichever process
    can run it, one that waits in a process tries at once. Returns how many steps were
    waiting. An unknown workflow raises WorkflowNotFoundError; a finished one, or one with
    no step waiting for a retry, WorkflowStatusError."""
    found = db.operations.retry_now(check_identifier(workflow_id, "workflow id"))
    if found is None:
        raise WorkflowNotFoundError(workflow_id)
    status, retrying = found
    if status.finished:
        raise WorkflowStatusError(
            workflow_id,
            status,
            f"workflow {workflow_id!r} already finished with status {status}: nothing to retry",
        )
    if not retrying:
        raise WorkflowStatusError(
            workflow_id,
            status,
            f"workflow {workflow_id!r} ({status}) is not waiting for a retry: no step of "
            "it waits out a failing dependency",
        )
    return retrying


def resolve_in_doubt_step(
    db: SystemDatabase,
    workflow_id: str,
    seq: int,
    *,
    output: str | None,
    owner_key: int | None = None,
) -> tuple[str, str]:
    """Resolve the in-doubt step ``seq`` (``output`` JSON text, or None to allow a rerun).

    The IN_DOUBT workflow becomes PENDING. Returns its ``(name, inputs)``.
    """
    info = db.workflows.get(check_identifier(workflow_id, "workflow id"))
    if info is None:
        raise WorkflowNotFoundError(workflow_id)
    step = next((s for s in db.steps.list(workflow_id) if s.seq == seq), None)
    if step is not None and step.waiting:
        raise WorkflowStatusError(
            workflow_id,
            info.status,
            f"workflow {workflow_id!r} step {seq} ({step.name}) is a wait in progress, not "
            "in doubt: there is nothing to resolve (it goes on when what it waits for comes)",
        )
    if (
        info.status is not WorkflowStatus.IN_DOUBT
        or step is None
        or step.status is not StepStatus.PENDING
    ):
        raise WorkflowStatusError(
            workflow_id,
            info.status,
            f"workflow {workflow_id!r} has no in-doubt step {seq} to resolve "
            f"(workflow status {info.status}, step "
            f"{'missing' if step is None else step.status})",
        )
    resolved = db.steps.resolve_in_doubt(workflow_id, seq, output, owner_key)
    if resolved is None:
        raise WorkflowStatusError(
            workflow_id,
            info.status,
            f"workflow {workflow_id!r} step {seq} was resolved concurrently",
        )
    return resolved


# -- through the launched runtime (dbos_agent.operations: cancel, resume, ...) -----------


def _definition_of(engine: Engine, workflow_id: str) -> WorkflowDefinition | None:
    """The registered function of a stored workflow (a workflow's name never changes)."""
    info = engine.db.workflows.get(check_identifier(workflow_id, "workflow id"))
    if info is None:
        raise WorkflowNotFoundError(workflow_id)
    return find_workflow(info.name)


def _run_here(
    engine: Engine, definition: WorkflowDefinition, workflow_id: str, inputs: str
) -> Future[Outcome] | None:
    """Run a PENDING workflow that this session now owns, from its log; its run's future
    (None: a run of it here is still stopping, and it is taken back once that has
    stopped). Raises WorkflowInputsError (recorded ERROR) when the inputs no longer fit."""
    (future,) = engine.start_claimed([Claim(definition, workflow_id, inputs)])
    if future is not None and future.done():
        error = future.result().error
        if isinstance(error, WorkflowInputsError):
            raise error
    return future


def cancel(workflow_id: str) -> WorkflowStatus:
    """Cancel a workflow; return the status it had (CANCELLED again is a no-op).

    PENDING, ENQUEUED, IN_DOUBT and dead-lettered workflows become CANCELLED.
    A run of it stops at its next step boundary: before the next step starts
    when it runs in this process (or hears the cancel notification), else when
    its next checkpoint is refused. Its ``result()`` raises
    :class:`WorkflowCancelledError`. A finished workflow raises
    :class:`WorkflowStatusError`. :func:`resume` undoes a cancel.
    """
    engine = current_engine()
    previous = cancel_workflow(engine.db, workflow_id)
    engine.note_cancelled(workflow_id)
    return previous


def resume(workflow_id: str) -> WorkflowHandle[Any]:
    """Continue a cancelled, dead-lettered or diverged workflow from its log; return its
    handle.

    Recorded steps are not run again. A dead letter gets its recovery attempts back; a
    DIVERGED one forgets which code versions diverged on it, so that every process may
    try it again (it is held again if the code still does not fit). If this process has
    the workflow's function it runs here now (and this executor owns it); otherwise it
    is PENDING without an owner, and a live process with the function takes it over at
    once. An IN_DOUBT workflow is resolved (and so resumed) with
    :func:`resolve_in_doubt` instead. As in DBOS, an ENQUEUED workflow or a delayed start
    starts now (outside its queue's limits), and a finished one is left as it is: its
    handle answers with its outcome.
    """
    engine = current_engine()
    definition = _definition_of(engine, workflow_id)
    result = resume_workflow(engine.db, workflow_id, **_placement(engine, definition))
    return _reopened(engine, definition, workflow_id, result.now, result.inputs)


def _placement(engine: Engine, definition: WorkflowDefinition | None) -> dict[str, Any]:
    """Who runs a workflow an action makes PENDING: this session when this process has
    its function, else whichever process claims it (on its own executor)."""
    here = definition is not None
    return {
        "executor_id": engine.executor_id if here else None,
        "owner_key": engine.session_key if here else None,
    }


def _reopened(
    engine: Engine,
    definition: WorkflowDefinition | None,
    workflow_id: str,
    now: WorkflowStatus | None,
    inputs: str,
) -> WorkflowHandle[Any]:
    """The handle of a workflow made PENDING again (resume, rewind), run here now when
    this session owns it; one back in its queue is left to a dispatcher with room."""
    future = None
    if definition is not None and now is WorkflowStatus.PENDING:
        future = _run_here(engine, definition, workflow_id, inputs)
    else:
        engine.wake_dispatcher()
    return WorkflowHandle(engine, workflow_id, future)


class ForkHandle(WorkflowHandle[Any]):
    """The handle of a forked workflow, with the step it was forked from."""

    def __init__(
        self, engine: Engine, workflow_id: str, future: Future[Outcome] | None, from_step: int
    ) -> None:
        super().__init__(engine, workflow_id, future)
        self._from_step = from_step

    @property
    def from_step(self) -> int:
        """The fork point: the ``from_step`` asked for, or the approval request below it
        that the fork asks again."""
        return self._from_step


def fork(
    workflow_id: str,
    from_step: int,
    *,
    new_workflow_id: str | None = None,
    inputs: Mapping[str, Any] | None = None,
    replace: Replacements | None = None,
    by: str | None = None,
) -> ForkHandle:
    """Start a new workflow (same function and inputs) that reuses the steps below ``from_step``.

    The new workflow replays the original's recorded results of steps
    ``0..from_step-1`` without running them, and runs live from ``from_step``:
    rerun an agent from turn N with a fixed tool. What the original published there
    (events, stream items) is the fork's too. An approval whose request or decision is
    just below ``from_step`` is asked again: the fork starts at that request (the
    handle's ``from_step`` says where it started). It gets ``new_workflow_id``
    (default: a fresh uuid) and records where it came from. It runs here now
    if this process has the function, else on the original's executor.

    Edited: ``inputs`` (``{"param": value}``) replaces those arguments; ``replace``
    (``{3: value}``, or ``{"3:search": value}`` to name the step too) gives replayed steps
    another recorded output. Each is checked against the signature and the step's return
    annotation, and the step against the log (a recorded result below the fork point);
    ForkEditError names the first that does not fit, and nothing is written. The edits
    are recorded on the fork, as made ``by`` (default: the OS user), with the time.
    """
    if new_workflow_id is not None:
        check_identifier(new_workflow_id, "new workflow id")
    engine = current_engine()
    definition = _definition_of(engine, workflow_id)
    edits = check_edits(
        engine.db,
        workflow_id,
        from_step,
        inputs=inputs,
        replace=replace,
        by=by,
        definition=definition,
    )
    new_id, result = fork_workflow(
        engine.db,
        workflow_id,
        from_step,
        new_workflow_id=new_workflow_id,
        edits=edits,
        **_placement(engine, definition),
    )
    future = None
    if definition is not None:
        future = _run_here(engine, definition, new_id, result.inputs)
    return ForkHandle(engine, new_id, future, result.from_step)


def rewind(workflow_id: str, to_step: int, *, by: str | None = None) -> WorkflowHandle[Any]:
    """Run a stopped workflow again in place, from step ``to_step``; return its handle.

    Its steps at and after ``to_step`` are deleted; the messages they received go back to
    its mailbox (a later ``recv`` takes them again), the stream items they wrote are
    deleted (a close among them too: the stream is open again), each event they set
    goes back to the value its last kept ``set_event`` gave it (or is deleted), and
    their approval requests are asked again. All in one statement: a refusal or a
    failure changes nothing. Finished (SUCCESS, ERROR), CANCELLED, dead-lettered,
    DIVERGED, IN_DOUBT and SUSPENDED workflows can be rewound; a PENDING one may be
    running, and is refused (cancel it first). The rewind is recorded in its edits (by
    ``by``, default the OS user). Like :func:`resume`, it runs here now if this process
    has its function, else in a live process that has it.
    """
    engine = current_engine()
    definition = _definition_of(engine, workflow_id)
    placement = _placement(engine, definition)
    result = rewind_workflow(engine.db, workflow_id, to_step, by=by, **placement)
    return _reopened(engine, definition, workflow_id, result.now, result.inputs)


def resolve_in_doubt(
    workflow_id: str, seq: int, *, result: Any = _UNSET, rerun: bool = False
) -> WorkflowHandle[Any]:
    """Resolve the in-doubt step ``seq`` of an IN_DOUBT workflow, and let it continue.

    Pass ``result=`` when the effect did happen (the step returns that value,
    stored as JSON), or ``rerun=True`` when it did not (the step runs again).
    The workflow becomes PENDING; if this process knows its function it
    resumes at once, otherwise the next recovery of its executor picks it up.
    """
    if rerun == (result is not _UNSET):
        raise ValueError("pass exactly one of result=... (it happened) or rerun=True")
    engine = current_engine()
    definition = _definition_of(engine, workflow_id)
    output = None if rerun else codec_for(Any).dumps(result, f"workflow {workflow_id!r} step {seq}")
    owner = engine.session_key if definition is not None else None
    _, inputs = resolve_in_doubt_step(engine.db, workflow_id, seq, output=output, owner_key=owner)
    future = None
    if definition is not None:
        future = _run_here(engine, definition, workflow_id, inputs)
    return WorkflowHandle(engine, workflow_id, future)
