"""The runtime: one per process, created by :func:`launch`.

It owns the system database, the worker pool and the table of workflows this
process is running, and it is where a workflow call is admitted (idempotent
start), executed and finished. Recovery lives in ``recovery.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import (
    CheckpointError,
    DbosAgentError,
    NotLaunchedError,
    SerializationError,
    WorkflowCancelledError,
    WorkflowIdConflictError,
    WorkflowInterruptedError,
)
from ..records import WorkflowStatus
from ..serialization import dumps_error
from ..storage.database import StepRow, SystemDatabase, WorkflowRow
from ..storage.session import ExecutorSession
from .context import OwnershipLost, WorkflowContext, entered_workflow
from .notifications import CANCEL_CHANNEL, Notifications
from .outcome import Outcome, capture, capture_async, workflow_outcome
from .registry import WorkflowDefinition
from .waiting import wait_for_stored_outcome
from .workers import WorkerPool

if TYPE_CHECKING:
    from .recovery import RecoveryReport

log = logging.getLogger("dbos_agent")

#: NOTIFY channel of cancels (sent by the cancel_workflow query); the payload is the id.


@dataclass(eq=False)
class WorkflowRun:
    """One execution of a workflow by this process, from admission to finish."""

    definition: WorkflowDefinition
    workflow_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    recorded: dict[int, StepRow]
    future: Future[Outcome] = field(default_factory=Future)


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
    ) -> None:
        self.db = db
        self.executor_id = executor_id
        self.app_version = app_version
        self.session = ExecutorSession(db, executor_id, app_version, lease_seconds)
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
        self._stopped = threading.Event()
        self._dispatch_wanted = threading.Event()

    def open(self) -> Runtime:
        """Register this process's executor session and start its heartbeat."""
        self.session_key = self.session.open()
        self.run_in_background(self._heartbeat, "dbos-agent-heartbeat")
        return self

    def wake_dispatcher(self) -> None:
        """Tell the queue dispatcher there may be work or room (an enqueue, a finish)."""
        self._dispatch_wanted.set()

    def wait_for_dispatch(self, timeout: float) -> None:
        """Sleep in the dispatcher until woken or ``timeout`` passes."""
        self._dispatch_wanted.wait(timeout)
        self._dispatch_wanted.clear()

    def _heartbeat(self) -> None:
        interval = max(0.05, self.session.lease_seconds / 3)
        while not self._stopped.wait(interval):
            if not self.session.heartbeat():
                log.error(
                    "executor session %s of %r lost its heartbeat; its workflows may be taken "
                    "over by other executors",
                    self.session_key,
                    self.executor_id,
                )

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
            inserted, row = self.db.insert_workflow(
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
            mine = row.status is WorkflowStatus.PENDING and row.owner_key == self.session_key
            if mine or (
                row.status is WorkflowStatus.PENDING
                and not row.owner_live
                and self.session_key is not None
                and self.db.take_over_workflow(
                    workflow_id, row.owner_key, self.session_key, self.executor_id
                )
            ):
                run.recorded = self.db.load_steps(workflow_id)
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

    def resume(
        self,
        definition: WorkflowDefinition,
        workflow_id: str,
        inputs: str,
        recorded: dict[int, StepRow] | None = None,
    ) -> Future[Outcome]:
        """Run a PENDING workflow from its log on the worker pool.

        Raises WorkflowInputsError when the recorded inputs no longer fit the
        function. If this process already runs it, returns that run's future.
        """
        args, kwargs = definition.inputs.loads(inputs, workflow_id)
        if recorded is None:
            recorded = self.db.load_steps(workflow_id)
        run = WorkflowRun(definition, workflow_id, args, kwargs, recorded)
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
        ctx = WorkflowContext(run.workflow_id, self, run.recorded)
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
        ctx = WorkflowContext(run.workflow_id, self, run.recorded)
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
        """Record the workflow's outcome (guarded: a run finished elsewhere wins)."""
        if ctx.cancelled is not None and ctx.diverged is None and ctx.in_doubt is None:
            return self._stop_cancelled(run)
        failed_write = ctx.checkpoint_error or (
            outcome.error if isinstance(outcome.error, CheckpointError) else None
        )
        if failed_write is not None:
            # the database failed, not the workflow: leave it PENDING for recovery
            self._abandon(run, failed_write)
            return Outcome(error=failed_write)
        # Divergence and doubt stop the workflow even if user code swallowed them.
        if ctx.diverged is not None:
            outcome = Outcome(error=ctx.diverged)
        elif ctx.in_doubt is not None:
            outcome = Outcome(error=ctx.in_doubt)
        output = error = None
        if outcome.error is None:
            try:
                output = run.definition.result.dumps(
                    outcome.value, f"workflow {run.workflow_id!r} ({run.definition.name}) result"
                )
            except SerializationError as exc:
                outcome = Outcome(error=exc)
        if outcome.error is not None:
            error = dumps_error(outcome.error)
        status = WorkflowStatus.SUCCESS if outcome.error is None else WorkflowStatus.ERROR
        if ctx.in_doubt is not None and ctx.diverged is None:
            status = WorkflowStatus.IN_DOUBT
        updated, stored_status, stored_output, stored_error = self.db.finish_workflow(
            run.workflow_id, status, output, error, self.session_key
        )
        if not updated and stored_status is WorkflowStatus.PENDING:
            # another session took the workflow over: its outcome is theirs to record
            self._abandon(run, OwnershipLost(run.workflow_id))
            return Outcome(error=OwnershipLost(run.workflow_id))
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

    def _stop_cancelled(self, run: WorkflowRun) -> Outcome:
        """A run that saw its workflow cancelled records nothing: the cancel did.

        If an operator resumed the workflow meanwhile (PENDING again), the
        resumed run records the outcome; this one only stops.
        """
        info = self.db.get_workflow(run.workflow_id)
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
        info = self.db.get_workflow(workflow_id)
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
                    log.error("workflow %s was interrupted: %r", run.workflow_id, exc)

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
        if admission.run is not None:
            outcome = self.execute(admission.run)
        else:
            future = admission.future()
            outcome = future.result() if future else self.wait_for_outcome(workflow_id)
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
        future = admission.future()
        if admission.run is not None:
            outcome = await self.execute_async(admission.run)
        elif future is not None:
            outcome = await asyncio.wrap_future(future)
        else:
            outcome = await asyncio.to_thread(self.wait_for_outcome, workflow_id)
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

        Waits up to ``grace`` seconds for them, then closes the database pool.
        """
        global _runtime
        self.stopping = True
        self._stopped.set()
        self.notifications.stop()  # waiting workflows stop now and stay PENDING
        self._dispatch_wanted.set()
        for thread in self._background:
            thread.join(grace)
        with self._lock:
            futures = [a.future for a in self._active.values()]
        wait_futures(futures, timeout=grace)
        self.pool.stop()
        self.session.close()
        self.db.close()
        with _runtime_lock:
            if _runtime is self:
                _runtime = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


_runtime_lock = threading.Lock()
_runtime: Runtime | None = None


def current_runtime() -> Runtime:
    """The launched runtime of this process."""
    runtime = _runtime
    if runtime is None:
        raise NotLaunchedError(
            "dbos_agent is not launched: call dbos_agent.launch() before running durable workflows"
        )
    return runtime


def launch(
    database_url: str | None = None,
    *,
    executor_id: str = "local",
    app_version: str | None = None,
    recover: bool = True,
    workers: int = 16,
    pool_size: int | None = None,
    lease_seconds: float = 30.0,
    run_queues: bool = True,
) -> Runtime:
    """Connect to the system database, apply the schema, and recover pending workflows.

    ``database_url`` defaults to ``$DBOS_AGENT_DATABASE_URL`` and then to an
    embedded Postgres kept under ``./.dbos_agent/``. Recovery of this
    executor's PENDING workflows runs in the background: ``launch`` returns
    at once. ``workers`` bounds the threads that run background and recovered
    workflows; ``pool_size`` the database connections (default: workers + 4).
    ``lease_seconds`` is how long this process's heartbeat lease lasts: other
    executors take its workflows over only after it ran out (a restart under
    the same ``executor_id`` does not wait when Postgres saw the process die).
    With ``run_queues`` this process also runs the workflows of the queues it
    defines, as its free worker slots and the queues' limits allow.
    """
    global _runtime
    from .queues import run_dispatcher
    from .recovery import recover_pending

    with _runtime_lock:
        if _runtime is not None:
            raise DbosAgentError(
                "dbos_agent is already launched in this process; "
                "call shutdown() on the runtime first"
            )
        url = database_url or os.environ.get("DBOS_AGENT_DATABASE_URL")
        if not url:
            from ..storage.embedded import embedded_database_url

            url = embedded_database_url()
        db = SystemDatabase(url, pool_size=pool_size or workers + 4)
        db.open()
        try:
            db.migrate()
        except BaseException:
            db.close()
            raise
        runtime = Runtime(
            db,
            executor_id=executor_id,
            app_version=app_version,
            workers=workers,
            lease_seconds=lease_seconds,
        )
        try:
            runtime.open()
        except BaseException:
            db.close()
            raise
        _runtime = runtime
    runtime.notifications.start()
    if recover:
        runtime.run_in_background(lambda: recover_pending(runtime), "dbos-agent-recovery")
    else:
        runtime.recovery_done.set()
    if run_queues:
        runtime.run_in_background(lambda: run_dispatcher(runtime), "dbos-agent-dispatcher")
    return runtime
