"""The engine: one per process, created by :func:`launch` behind its public handle.

It owns the system database, the executor session, the worker pool and the
table of workflows this process is running, and it is where a workflow call is
admitted (idempotent start), executed and finished. Recovery lives in
``recovery.py``, the ownership check before a live step in ``ownership.py``.

It is a little over 500 lines on purpose: a run's whole life in this process (admitted,
executed, finished or stopped for one of the reasons of ``StopReason``, released) reads
in one place, next to the shutdown that ends every run; what can live apart already does
(recovery, ownership, the run table, suspension, waking, timers, messaging).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    NotLaunchedError,
    SerializationError,
    WorkflowCancelledError,
    WorkflowInterruptedError,
)
from ..limits import check_identifier
from ..records import WorkflowStatus
from ..serialization import dumps_error
from ..storage.database import SystemDatabase
from ..storage.rows import StepRow
from ..storage.session import ExecutorSession, end_dead_local_sessions
from . import state, tracing
from .context import (
    OwnershipLost,
    StopReason,
    WorkflowContext,
    current_workflow_id,
    current_workflow_timeout,
    entered_workflow,
)
from .event_loop import EventLoop
from .notifications import CANCEL_CHANNEL, Notifications
from .outcome import Outcome, capture, capture_async, stored_outcome, workflow_outcome
from .plans import Plan, run_plan
from .registry import WorkflowDefinition
from .runs import Admission, RunTable, WorkflowRun, check_same_call
from .suspension import Suspended
from .waiting import finished_outcome
from .workers import WorkerPool

if TYPE_CHECKING:
    from .recovery import RecoveryReport

log = logging.getLogger(__name__)


class Engine:
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
        suspend_after: float = 1.0,
        async_runs: int = 1000,
    ) -> None:
        if suspend_after < 0:
            raise ValueError(f"suspend_after must be >= 0 seconds, got {suspend_after}")
        self.db = db
        #: A background run whose wait is longer than this (seconds) suspends.
        self.suspend_after = suspend_after
        self.executor_id = check_identifier(executor_id, "executor id")
        self.app_version = app_version
        self.session = ExecutorSession(
            db, executor_id, app_version, lease_seconds, grace_seconds=session_grace
        )
        self.session_key: int | None = None
        self.pool = WorkerPool(workers)
        #: Where background async runs execute: one loop, its blocking calls on as many
        #: threads as there are database connections.
        self.loop = EventLoop(io_threads=db.pool_size, max_runs=async_runs)
        #: LISTEN/NOTIFY wake-ups for recv, get_event and other waiters (notifications.py).
        self.notifications = Notifications(db)
        self.stopping = False
        self._stopped = threading.Event()
        self.recovery_done = threading.Event()
        self.last_recovery: RecoveryReport | None = None
        self._lock = threading.Lock()
        self.runs = RunTable()
        self.notifications.subscribe(CANCEL_CHANNEL, self.note_cancelled)
        self._background: list[threading.Thread] = []
        self._dispatch_wanted = threading.Event()
        #: Woken when this process may own workflows it does not run (after an outage).
        self.take_back_wanted = threading.Event()
        #: Called when every wait is woken (shutdown, a moved clock): the waker's poke.
        self._wake_hooks: list[Callable[[], None]] = []
        self._suspend_hooks: list[Callable[[], None]] = []
        self._shut_down = False

    def open(self) -> Engine:
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

    def advance_clock(self, seconds: float) -> None:
        """Move this process's database clock (for tests), and wake what waits on it:
        sleeps and recv/get_event deadlines look again, the dispatcher re-reads limits."""
        self.db.advance_clock(seconds)
        self._wake_everything()

    def on_suspended(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when a run here suspends its workflow with a timer (the waker
        then sleeps until the earliest one)."""
        self._suspend_hooks.append(hook)

    def note_suspended(self, wake_at: float | None) -> None:
        """A run of this process suspended its workflow (see suspension.py)."""
        if wake_at is not None:
            for hook in self._suspend_hooks:
                hook()

    def on_wake_all(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` too whenever every wait is woken (shutdown, a moved clock)."""
        self._wake_hooks.append(hook)

    def _wake_everything(self) -> None:
        self.notifications.wake_all()
        self.wake_dispatcher()
        for hook in self._wake_hooks:
            hook()

    def wait_while_running(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, less if shutdown begins; True once it has."""
        return self._stopped.wait(timeout)

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
        gone is taken over and continued from its log by the caller. Another
        function or other inputs under the id raise :class:`WorkflowIdConflictError`.
        """
        if self.stopping:
            raise NotLaunchedError("the dbos_agent engine is shutting down")
        check_identifier(workflow_id, "workflow id")
        inputs = definition.inputs.dumps(args, kwargs)
        run = WorkflowRun(definition, workflow_id, args, kwargs, {})
        active = self.runs.claim(run, inputs)
        if active is not None:
            check_same_call(workflow_id, definition.name, inputs, active.name, active.inputs)
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
                parent_id=current_workflow_id(),
                timeout=current_workflow_timeout(),
            )
            if inserted and queue_name is None:
                return Admission(run=run)
            if not inserted:
                check_same_call(workflow_id, definition.name, inputs, row.name, row.inputs)
            if row.status.finished:
                outcome = stored_outcome(
                    workflow_id, row.status, row.output, row.error, definition.result
                )
                self._resolve(run, outcome)
                return Admission(finished=outcome)
            pending = row.status is WorkflowStatus.PENDING
            mine = pending and row.owner_key == self.session_key
            if not mine:
                run.owned_streak = self.ownership_mark()
                if pending and row.owner_live:  # a dead process here is declared dead now
                    end_dead_local_sessions(self.db)
            # the take-over is guarded on the owner's session being dead, whoever (recovery
            # in this process, another one) found it dead since the row was read
            if mine or (
                pending
                and self.session_key is not None
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

    def adopt(self, run: WorkflowRun) -> bool:
        """Register a run that recovery found; False if this process already runs it."""
        inputs = run.definition.inputs.dumps(run.args, run.kwargs)
        return self.runs.claim(run, inputs) is None

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
            # Held by a run here, or only by a call that is looking at the row (admit) and
            # may let it go without running it: then take it back once it is let go.
            held = self.active_future(workflow_id)
            if held is None:
                self.take_back_wanted.set()
                return run.future
            held.add_done_callback(lambda _: self.take_back_wanted.set())
            return held
        if definition.is_async:
            self.loop.wait_for_room()
        else:
            self.pool.wait_for_room(backlog=self.pool.size * 2)
        return self.submit(run)

    def active_ids(self) -> list[str]:
        """Ids of the workflows this process is running now."""
        return self.runs.ids()

    def active_future(self, workflow_id: str) -> Future[Outcome] | None:
        """The in-process future of a workflow this process runs, if it does."""
        return self.runs.future(workflow_id)

    # -- execution ---------------------------------------------------------------------

    def execute(self, run: WorkflowRun) -> Outcome:
        """Run a sync workflow's body in this thread and record its outcome."""
        ctx = WorkflowContext(
            run.workflow_id, self, run.recorded, run.owned_streak, suspendable=run.background
        )
        try:
            with tracing.span(_run_span, run) as current, entered_workflow(ctx):
                outcome = capture(run.definition.fn, *run.args, **run.kwargs)
                tracing.failed(current, outcome.error)
            return self.finish(run, ctx, outcome)
        except BaseException as exc:
            return self._ended_early(run, exc)

    async def execute_async(self, run: WorkflowRun) -> Outcome:
        """Run an async workflow's body on this event loop and record its outcome."""
        ctx = WorkflowContext(
            run.workflow_id,
            self,
            run.recorded,
            run.owned_streak,
            suspendable=run.background,
            loop_thread=threading.get_ident(),
        )
        try:
            with tracing.span(_run_span, run) as current, entered_workflow(ctx):
                outcome = await capture_async(run.definition.fn(*run.args, **run.kwargs))
                tracing.failed(current, outcome.error)
            return await asyncio.to_thread(self.finish, run, ctx, outcome)
        except BaseException as exc:
            return self._ended_early(run, exc)

    def _ended_early(self, run: WorkflowRun, exc: BaseException) -> Outcome:
        """A run that ended by an exception out of the workflow's code or its finish: a
        suspension or a lost workflow ends it quietly; anything else (shutdown, a crash)
        leaves the workflow PENDING and is raised again."""
        if isinstance(exc, Suspended):
            return self._stop_suspended(run)
        self._abandon(run, exc)
        if isinstance(exc, OwnershipLost):
            return Outcome(error=exc)
        raise exc

    def finish(self, run: WorkflowRun, ctx: WorkflowContext, outcome: Outcome) -> Outcome:
        """Record the workflow's outcome, or stop without one (see StopReason)."""
        if ctx.stop_reason is None and isinstance(outcome.error, DatabaseUnavailableError):
            ctx.halt(StopReason.DATABASE, outcome.error)
        reason, stop_error = ctx.stop_reason, ctx.stop_error
        try:
            if reason is StopReason.CANCELLED:
                return self._stop_cancelled(run)
            if reason is StopReason.SUSPENDED:
                return self._stop_suspended(run)
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
            outcome = stored_outcome(
                run.workflow_id, stored_status, stored_output, stored_error, run.definition.result
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
            self.runs.park(run.workflow_id)
            log.error(
                "workflow %s stopped and stays PENDING until a process that can run it "
                "continues it (resume, recovery): %s",
                run.workflow_id,
                why,
            )
        self._abandon(run, why)
        return Outcome(error=why)

    def _stop_suspended(self, run: WorkflowRun) -> Outcome:
        """The run gave its workflow up to wait (see suspension.py): it records nothing
        more, and whoever waits for the outcome waits on the database (a waker runs the
        workflow again, here or elsewhere, when its wait can be met)."""
        outcome = Outcome(
            error=WorkflowInterruptedError(
                f"workflow {run.workflow_id!r} is suspended: it waits without a thread and "
                "continues when woken"
            )
        )
        self._resolve(run, outcome)
        return outcome

    def parked_ids(self) -> list[str]:
        """Workflows this process will not take back by itself (see ``RunTable.park``)."""
        return self.runs.parked()

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
        self.runs.flag_cancelled(workflow_id)

    def cancellation(self, workflow_id: str) -> WorkflowCancelledError | None:
        """The error that stops a run of ``workflow_id`` at its next step, if it was cancelled.

        Checked at every step boundary, so the common case is one set lookup.
        A flagged workflow is confirmed in the database: one resumed since the
        cancel is PENDING again and goes on.
        """
        if not self.runs.take_cancel_flag(workflow_id):
            return None
        info = self.db.workflows.get(workflow_id)
        if info is not None and info.status is WorkflowStatus.PENDING:
            return None
        return WorkflowCancelledError(f"workflow {workflow_id!r} was cancelled")

    def _resolve(self, run: WorkflowRun, outcome: Outcome) -> None:
        self.runs.release(run)
        if (
            state.queues
        ):  # a slot may have freed up (without queues, waking it costs a thread switch)
            self._dispatch_wanted.set()
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
        """Run ``run`` in the background; the future resolves with its outcome. A sync
        workflow takes a thread of the worker pool, an async one a task on the shared
        event loop. A background run's long waits suspend (see suspension.py)."""
        run.background = True
        if run.definition.is_async:
            self.loop.submit(self._background_async(run))
        else:
            self.pool.submit(lambda: self._background_sync(run))
        return run.future

    def _background_sync(self, run: WorkflowRun) -> None:
        try:
            self.execute(run)
        except BaseException as exc:  # already resolved by _abandon
            self._note_interrupted(run, exc)

    async def _background_async(self, run: WorkflowRun) -> None:
        try:
            await self.execute_async(run)
        except BaseException as exc:  # already resolved by _abandon
            self._note_interrupted(run, exc)

    def _note_interrupted(self, run: WorkflowRun, exc: BaseException) -> None:
        if not self.stopping:
            log.error("workflow %s was interrupted: %s", run.workflow_id, exc)

    def wait_for_outcome(self, workflow_id: str, timeout: float | None = None) -> Outcome:
        """Wait until the workflow is finished, by whichever process runs it.

        Waits on the in-process run when there is one, else polls the
        database. A run here that stops without an outcome (taken over,
        shut down, suspended) falls back to the database. Raises TimeoutError.
        """
        return run_plan(self.outcome_of(workflow_id, timeout))

    def outcome_of(self, workflow_id: str, timeout: float | None = None) -> Plan[Outcome]:
        """:meth:`wait_for_outcome` as a plan, for sync and async callers alike."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            outcome = yield from finished_outcome(
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
        self._stopped.set()
        self.notifications.stop()  # waiting workflows stop now and stay PENDING
        self._dispatch_wanted.set()
        self.take_back_wanted.set()
        for hook in self._wake_hooks:
            hook()
        for thread in self._background:
            thread.join(grace)
        wait_futures(self.runs.futures(), timeout=grace)
        self.loop.stop()
        self.pool.stop()
        self.session.close()
        self.db.close()
        state.clear_engine(self)

    def _shutdown_at_exit(self) -> None:
        """A runtime launched without ``with`` ends cleanly when the program does, before
        an embedded Postgres it uses is stopped under it."""
        self.shutdown(grace=2.0)


def _run_span(run: WorkflowRun) -> tuple[str, dict[str, Any]]:
    """The name and attributes of a run's span (see tracing.py)."""
    return f"workflow {run.definition.name}", {
        "dbos_agent.workflow_id": run.workflow_id,
        "dbos_agent.workflow_name": run.definition.name,
        "dbos_agent.recovered": bool(run.recorded),
        "dbos_agent.steps_replayed": 0,
    }
