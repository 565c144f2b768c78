"""The runtime: one per process, created by :func:`launch`.

It owns the system database, the executor session, the worker pool and the
table of workflows this process is running, and it is where a workflow call is
admitted (idempotent start), executed and finished. Recovery lives in
``recovery.py``, the ownership check before a live step in ``ownership.py``.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    NotLaunchedError,
    SerializationError,
    WorkflowCancelledError,
    WorkflowIdConflictError,
    WorkflowInterruptedError,
)
from ..limits import check_identifier
from ..records import WorkflowStatus
from ..serialization import dumps_error
from ..storage.database import SystemDatabase
from ..storage.rows import StepRow, WorkflowRow
from ..storage.session import ExecutorSession, end_dead_local_sessions
from . import state
from .context import OwnershipLost, StopReason, WorkflowContext, entered_workflow
from .notifications import CANCEL_CHANNEL, Notifications
from .outcome import Outcome, capture, capture_async, workflow_outcome
from .registry import WorkflowDefinition
from .waiting import wait_for_stored_outcome
from .workers import WorkerPool

if TYPE_CHECKING:
    from .recovery import RecoveryReport

log = logging.getLogger(__name__)

#: A direct call of a workflow another session runs looks again this often whether
#: that session died (and the caller should take the workflow over).
_READMIT_EVERY_S = 1.0


@dataclass(eq=False)
class WorkflowRun:
    """One execution of a workflow by this process, from admission to finish."""

    definition: WorkflowDefinition
    workflow_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    recorded: dict[int, StepRow]
    future: Future[Outcome] = field(default_factory=Future)
    #: The session streak in which this process became the owner (-1: check first).
    owned_streak: int = -1


@dataclass(frozen=True, slots=True)
class _Active:
    name: str
    inputs: str
    future: Future[Outcome]


@dataclass(frozen=True, slots=True)
class Admission:
    """What a workflow call must do: run it, wait for this process's run, or return."""

    run: WorkflowRun | None = None
    attached: Future[Outcome] | None = None
    finished: Outcome | None = None
    #: Another session runs it (or it waits in a queue): wait on the database.
    remote: bool = False

    def future(self) -> Future[Outcome] | None:
        """The in-process future to wait on; None when only the database can tell."""
        if self.run is not None:
            return self.run.future
        if self.attached is not None:
            return self.attached
        if self.remote:
            return None
        done: Future[Outcome] = Future()
        done.set_result(self.finished or Outcome())
        return done


def _same_json(a: str, b: str) -> bool:
    return bool(a == b or json.loads(a) == json.loads(b))


class Runtime:
    """Runs durable workflows against one system database."""

    def __init__(
        self,
        db: SystemDatabase,
        *,
        executor_id: str = "local",
        app_version: str | None = None,
        workers: int = 16,
        lease_seconds: float = 30.0,
        session_grace: float = 3.0,
    ) -> None:
        self.db = db
        self.executor_id = check_identifier(executor_id, "executor id")
        self.app_version = app_version
        self.session = ExecutorSession(
            db, executor_id, app_version, lease_seconds, grace_seconds=session_grace
        )
        self.session_key: int | None = None
        self.pool = WorkerPool(workers)
        #: LISTEN/NOTIFY wake-ups for recv, get_event and other waiters (notifications.py).
        self.notifications = Notifications(db)
        self.stopping = False
        self.recovery_done = threading.Event()
        self.last_recovery: RecoveryReport | None = None
        self._lock = threading.Lock()
        self._active: dict[str, _Active] = {}
        #: Running here and cancelled (by da.cancel here, or a NOTIFY from elsewhere).
        self._cancelled: set[str] = set()
        self.notifications.subscribe(CANCEL_CHANNEL, self.note_cancelled)
        self._background: list[threading.Thread] = []
        self._dispatch_wanted = threading.Event()
        #: Woken when this process may own workflows it does not run (after an outage).
        self.take_back_wanted = threading.Event()
        #: Workflows this process stopped for a failure that retrying will not fix (a
        #: broken schema): left PENDING for the next process, not taken back here.
        self._parked: set[str] = set()
        self._shut_down = False

    def open(self) -> Runtime:
        """Register this process's executor session (it heartbeats from now on)."""
        self.session_key = self.session.open()
        atexit.register(self._shutdown_at_exit)
        return self

    def ownership_mark(self) -> int:
        """Call right before a statement that makes this session a workflow's owner: the
        streak a run started from it may rely on (-1 when the fence does not hold)."""
        fence = self.session.state
        return fence.streak if fence.holds() else -1

    def wake_dispatcher(self) -> None:
        """Tell the queue dispatcher there may be work or room (an enqueue, a finish)."""
        self._dispatch_wanted.set()

    def wait_for_dispatch(self, timeout: float) -> None:
        """Sleep in the dispatcher until woken or ``timeout`` passes."""
        self._dispatch_wanted.wait(timeout)
        self._dispatch_wanted.clear()

    # -- admission: idempotent start ---------------------------------------------------

    def admit(
        self,
        definition: WorkflowDefinition,
        workflow_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        queue_name: str | None = None,
        priority: int = 0,
    ) -> Admission:
        """Record the call (or find it recorded) and decide who runs it.

        A new id is inserted PENDING and run by the caller (or ENQUEUED when
        ``queue_name`` is given, for a worker to run). A finished one returns
        its recorded outcome. A pending one running here is attached to; one
        whose session is alive elsewhere is waited for; one whose session is
        gone is taken over and resumed from its log by the caller. Another
        function or other inputs under the id raise :class:`WorkflowIdConflictError`.
        """
        if self.stopping:
            raise NotLaunchedError("the dbos_agent runtime is shutting down")
        check_identifier(workflow_id, "workflow id")
        inputs = definition.inputs.dumps(args, kwargs)
        run = WorkflowRun(definition, workflow_id, args, kwargs, {})
        with self._lock:
            active = self._active.get(workflow_id)
            if active is None:
                self._active[workflow_id] = _Active(definition.name, inputs, run.future)
        if active is not None:
            self._check_same(workflow_id, definition.name, inputs, active.name, active.inputs)
            return Admission(attached=active.future)
        try:
            run.owned_streak = self.ownership_mark()
            inserted, row = self.db.workflows.insert(
                workflow_id=workflow_id,
                name=definition.name,
                inputs=inputs,
                executor_id=self.executor_id,
                app_version=self.app_version,
                max_recovery_attempts=definition.max_recovery_attempts,
                owner_key=self.session_key,
                queue_name=queue_name,
                priority=priority,
            )
            if inserted and queue_name is None:
                return Admission(run=run)
            if not inserted:
                self._check_same(workflow_id, definition.name, inputs, row.name, row.inputs)
            if row.status.finished:
                outcome = self._stored_outcome(row, definition)
                self._resolve(run, outcome)
                return Admission(finished=outcome)
            pending = row.status is WorkflowStatus.PENDING
            mine = pending and row.owner_key == self.session_key
            if not mine:
                run.owned_streak = self.ownership_mark()
            if mine or (
                pending
                and self.session_key is not None
                and (not row.owner_live or end_dead_local_sessions(self.db) > 0)
                and self.db.workflows.take_over(
                    workflow_id, row.owner_key, self.session_key, self.executor_id
                )
            ):
                run.recorded = self.db.steps.load(workflow_id)
                return Admission(run=run)
            self._resolve(run, Outcome())  # not ours to run: stop tracking it here
            return Admission(remote=True)
        except Exception as exc:
            self._resolve(run, Outcome(error=exc))
            raise
        except BaseException as exc:
            self._abandon(run, exc)
            raise

    @staticmethod
    def _check_same(
        workflow_id: str, name: str, inputs: str, other_name: str, other_inputs: str
    ) -> None:
        if name != other_name:
            raise WorkflowIdConflictError(
                f"workflow id {workflow_id!r} already belongs to workflow {other_name!r}, "
                f"not {name!r}"
            )
        if not _same_json(inputs, other_inputs):
            raise WorkflowIdConflictError(
                f"workflow id {workflow_id!r} was already used for {name!r} with other inputs "
                f"(recorded {other_inputs}, now {inputs})"
            )

    @staticmethod
    def _stored_outcome(row: WorkflowRow, definition: WorkflowDefinition) -> Outcome:
        return workflow_outcome(
            row.workflow_id,
            row.status,
            None if row.output is None else json.loads(row.output),
            None if row.error is None else json.loads(row.error),
            definition.result,
        )

    def adopt(self, run: WorkflowRun) -> bool:
        """Register a run that recovery found; False if this process already runs it."""
        inputs = run.definition.inputs.dumps(run.args, run.kwargs)
        with self._lock:
            if run.workflow_id in self._active:
                return False
            self._active[run.workflow_id] = _Active(run.definition.name, inputs, run.future)
        return True

    def run_from_log(
        self,
        definition: WorkflowDefinition,
        workflow_id: str,
        inputs: str,
        recorded: dict[int, StepRow] | None = None,
        *,
        owned_streak: int = -1,
    ) -> Future[Outcome]:
        """Run a PENDING workflow this session owns, from its log, on the worker pool.

        ``owned_streak`` is the :meth:`ownership_mark` taken before the statement that
        made this session the owner. Raises WorkflowInputsError when the recorded
        inputs no longer fit the function. If this process already runs it, returns
        that run's future.
        """
        args, kwargs = definition.inputs.loads(inputs, workflow_id)
        if recorded is None:
            recorded = self.db.steps.load(workflow_id)
        run = WorkflowRun(
            definition, workflow_id, args, kwargs, recorded, owned_streak=owned_streak
        )
        if not self.adopt(run):
            return self.active_future(workflow_id) or run.future
        self.pool.wait_for_room(backlog=self.pool.size * 2)
        return self.submit(run)

    def active_ids(self) -> list[str]:
        """Ids of the workflows this process is running now."""
        with self._lock:
            return list(self._active)

    def active_future(self, workflow_id: str) -> Future[Outcome] | None:
        """The in-process future of a workflow this process runs, if it does."""
        with self._lock:
            active = self._active.get(workflow_id)
        return active.future if active else None

    # -- execution ---------------------------------------------------------------------

    def execute(self, run: WorkflowRun) -> Outcome:
        """Run a sync workflow's body in this thread and record its outcome."""
        ctx = WorkflowContext(run.workflow_id, self, run.recorded, run.owned_streak)
        try:
            with entered_workflow(ctx):
                outcome = capture(run.definition.fn, *run.args, **run.kwargs)
            return self.finish(run, ctx, outcome)
        except OwnershipLost as exc:
            self._abandon(run, exc)
            return Outcome(error=exc)
        except BaseException as exc:
            self._abandon(run, exc)
            raise

    async def execute_async(self, run: WorkflowRun) -> Outcome:
        """Run an async workflow's body on this event loop and record its outcome."""
        ctx = WorkflowContext(run.workflow_id, self, run.recorded, run.owned_streak)
        try:
            with entered_workflow(ctx):
                outcome = await capture_async(run.definition.fn(*run.args, **run.kwargs))
            return await asyncio.to_thread(self.finish, run, ctx, outcome)
        except OwnershipLost as exc:
            self._abandon(run, exc)
            return Outcome(error=exc)
        except BaseException as exc:
            self._abandon(run, exc)
            raise

    def finish(self, run: WorkflowRun, ctx: WorkflowContext, outcome: Outcome) -> Outcome:
        """Record the workflow's outcome, or stop without one (see StopReason)."""
        if ctx.stop_reason is None and isinstance(outcome.error, DatabaseUnavailableError):
            ctx.halt(StopReason.DATABASE, outcome.error)
        reason, stop_error = ctx.stop_reason, ctx.stop_error
        try:
            if reason is StopReason.CANCELLED:
                return self._stop_cancelled(run)
            if reason in (StopReason.NOT_OWNER, StopReason.DATABASE, StopReason.UNCONFIGURED):
                assert stop_error is not None
                return self._stop_unfinished(run, stop_error)
            status = WorkflowStatus.SUCCESS
            if reason is not None:  # divergence and doubt stop it even if user code swallowed them
                outcome = Outcome(error=stop_error)
                status = WorkflowStatus.IN_DOUBT if reason is StopReason.IN_DOUBT else status
            return self._record_outcome(run, outcome, status)
        except DatabaseUnavailableError as exc:
            return self._stop_unfinished(run, exc)

    def _record_outcome(
        self, run: WorkflowRun, outcome: Outcome, status: WorkflowStatus
    ) -> Outcome:
        """Write a finished run's outcome (guarded: a run finished elsewhere wins)."""
        where = f"workflow {run.workflow_id!r} ({run.definition.name}) result"
        while True:
            output = error = None
            if outcome.error is None:
                try:
                    output = run.definition.result.dumps(outcome.value, where)
                except SerializationError as exc:
                    outcome = Outcome(error=exc)
            if outcome.error is not None:
                error = dumps_error(outcome.error)
                if status is WorkflowStatus.SUCCESS:
                    status = WorkflowStatus.ERROR
            try:
                updated, stored_status, stored_output, stored_error = self.db.workflows.finish(
                    run.workflow_id, status, output, error, self.session_key
                )
                break
            except SerializationError as exc:  # too large, or refused: the user's error
                if outcome.error is not None:
                    raise
                outcome = Outcome(error=exc)
        if not updated and stored_status is WorkflowStatus.PENDING:
            # another session took the workflow over: its outcome is theirs to record
            return self._stop_unfinished(run, OwnershipLost(run.workflow_id))
        if not updated:
            outcome = self._stored_outcome(
                WorkflowRow(
                    run.workflow_id,
                    run.definition.name,
                    stored_status,
                    "{}",
                    stored_output,
                    stored_error,
                ),
                run.definition,
            )
        self._resolve(run, outcome)
        return outcome

    def _stop_unfinished(self, run: WorkflowRun, why: BaseException) -> Outcome:
        """This run ends without an outcome; the workflow stays PENDING. After a database
        failure this process takes it back once the database answers (unless retrying
        cannot help: then it waits for the next process)."""
        if isinstance(why, DatabaseUnavailableError) and why.retryable:
            self.take_back_wanted.set()
        elif isinstance(why, DatabaseUnavailableError | ConfigurationError):
            with self._lock:
                self._parked.add(run.workflow_id)
            log.error(
                "workflow %s stopped and stays PENDING until a process that can run it "
                "continues it (resume, recovery): %s",
                run.workflow_id,
                why,
            )
        self._abandon(run, why)
        return Outcome(error=why)

    def parked_ids(self) -> list[str]:
        """Workflows this process will not take back by itself (see ``_parked``)."""
        with self._lock:
            return list(self._parked)

    def _stop_cancelled(self, run: WorkflowRun) -> Outcome:
        """A run that saw its workflow cancelled records nothing: the cancel did.

        If an operator resumed the workflow meanwhile (PENDING again), the
        resumed run records the outcome; this one only stops.
        """
        info = self.db.workflows.get(run.workflow_id)
        if info is None or info.status is WorkflowStatus.PENDING:
            self._abandon(run, WorkflowCancelledError(f"workflow {run.workflow_id!r} was resumed"))
            return run.future.result()
        outcome = workflow_outcome(
            run.workflow_id, info.status, info.output, info.error, run.definition.result
        )
        self._resolve(run, outcome)
        return outcome

    # -- cancellation --------------------------------------------------------------------

    def note_cancelled(self, workflow_id: str) -> None:
        """A cancel of ``workflow_id`` committed: its run here stops before its next step.

        Called by ``da.cancel`` in this process, and by the notification
        listener for cancels from anywhere else (the CLI, another process). A
        lost NOTIFY only means the run stops at its next checkpoint instead.
        """
        with self._lock:
            if workflow_id in self._active:
                self._cancelled.add(workflow_id)

    def cancellation(self, workflow_id: str) -> WorkflowCancelledError | None:
        """The error that stops a run of ``workflow_id`` at its next step, if it was cancelled.

        Checked at every step boundary, so the common case is one set lookup.
        A flagged workflow is confirmed in the database: one resumed since the
        cancel is PENDING again and goes on.
        """
        if workflow_id not in self._cancelled:
            return None
        with self._lock:
            self._cancelled.discard(workflow_id)
        info = self.db.workflows.get(workflow_id)
        if info is not None and info.status is WorkflowStatus.PENDING:
            return None
        return WorkflowCancelledError(f"workflow {workflow_id!r} was cancelled")

    def _resolve(self, run: WorkflowRun, outcome: Outcome) -> None:
        with self._lock:
            active = self._active.get(run.workflow_id)
            if active is not None and active.future is run.future:
                del self._active[run.workflow_id]
                self._cancelled.discard(run.workflow_id)
        self._dispatch_wanted.set()  # a slot may have freed up
        if not run.future.done():
            run.future.set_result(outcome)

    def _abandon(self, run: WorkflowRun, exc: BaseException) -> None:
        """This process stops running the workflow without an outcome; it stays PENDING."""
        self._resolve(
            run,
            Outcome(
                error=WorkflowInterruptedError(
                    f"workflow {run.workflow_id!r} was interrupted in this process "
                    f"({type(exc).__name__}: {exc}); it stays PENDING and will be recovered"
                )
            ),
        )

    def submit(self, run: WorkflowRun) -> Future[Outcome]:
        """Run ``run`` on the worker pool; the future resolves with its outcome."""

        def job() -> None:
            try:
                if run.definition.is_async:
                    asyncio.run(self.execute_async(run))
                else:
                    self.execute(run)
            except BaseException as exc:  # already resolved by _abandon
                if not self.stopping:
                    log.error("workflow %s was interrupted: %s", run.workflow_id, exc)

        self.pool.submit(job)
        return run.future

    def call(
        self,
        definition: WorkflowDefinition,
        workflow_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """A direct call of a sync workflow: run it here, now, durably."""
        admission = self.admit(definition, workflow_id, args, kwargs)
        while admission.remote:  # another session runs it: wait, or take it once it died
            try:
                return self.wait_for_outcome(workflow_id, _READMIT_EVERY_S).unwrap()
            except TimeoutError:
                admission = self.admit(definition, workflow_id, args, kwargs)
        if admission.run is not None:
            outcome = self.execute(admission.run)
        else:
            future = admission.future()
            assert future is not None
            outcome = future.result()
        if isinstance(outcome.error, (OwnershipLost, WorkflowInterruptedError)):
            outcome = self.wait_for_outcome(workflow_id)
        return outcome.unwrap()

    async def call_async(
        self,
        definition: WorkflowDefinition,
        workflow_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """A direct call of an async workflow: run it on this event loop, durably."""
        admission = await asyncio.to_thread(self.admit, definition, workflow_id, args, kwargs)
        while admission.remote:  # another session runs it: wait, or take it once it died
            try:
                found = await asyncio.to_thread(
                    self.wait_for_outcome, workflow_id, _READMIT_EVERY_S
                )
                return found.unwrap()
            except TimeoutError:
                admission = await asyncio.to_thread(
                    self.admit, definition, workflow_id, args, kwargs
                )
        future = admission.future()
        if admission.run is not None:
            outcome = await self.execute_async(admission.run)
        else:
            assert future is not None
            outcome = await asyncio.wrap_future(future)
        if isinstance(outcome.error, (OwnershipLost, WorkflowInterruptedError)):
            outcome = await asyncio.to_thread(self.wait_for_outcome, workflow_id)
        return outcome.unwrap()

    def wait_for_outcome(self, workflow_id: str, timeout: float | None = None) -> Outcome:
        """Wait until the workflow is finished, by whichever process runs it.

        Waits on the in-process run when there is one, else polls the
        database. A run here that stops without an outcome (taken over,
        shut down) falls back to the database. Raises TimeoutError.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            outcome = wait_for_stored_outcome(
                self.db, workflow_id, remaining, lambda: self.active_future(workflow_id)
            )
            if not isinstance(outcome.error, (OwnershipLost, WorkflowInterruptedError)):
                return outcome

    # -- lifecycle ---------------------------------------------------------------------

    def run_in_background(self, target: Callable[[], object], name: str) -> None:
        """Start a daemon thread the runtime waits for at shutdown."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._background.append(thread)
        thread.start()

    def shutdown(self, grace: float = 10.0) -> None:
        """Stop taking work; running workflows stop at their next step and stay PENDING.

        Waits up to ``grace`` seconds for them, then ends the executor session (its
        unfinished workflows are claimable at once) and closes the database pool. Called
        by ``with``/``async with launch()``, and at interpreter exit for a runtime that
        was never shut down. A second call does nothing.
        """
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        atexit.unregister(self._shutdown_at_exit)
        self.stopping = True
        self.notifications.stop()  # waiting workflows stop now and stay PENDING
        self._dispatch_wanted.set()
        self.take_back_wanted.set()
        for thread in self._background:
            thread.join(grace)
        with self._lock:
            futures = [a.future for a in self._active.values()]
        wait_futures(futures, timeout=grace)
        self.pool.stop()
        self.session.close()
        self.db.close()
        state.clear_runtime(self)

    def _shutdown_at_exit(self) -> None:
        """A runtime launched without ``with`` ends cleanly when the program does, before
        an embedded Postgres it uses is stopped under it."""
        self.shutdown(grace=2.0)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.shutdown)
