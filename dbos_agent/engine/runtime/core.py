"""The engine: one per process, created by :func:`launch` behind its public handle.

It owns the system database, the executor session, the worker pool and the
table of workflows this process is running, and it is where a workflow call is
admitted (idempotent start), a claimed workflow started (``start_claimed``: the one way
a wake, a recovery claim, a dequeue, a take-back or an operator action starts a run),
executed and finished, or held when its code no longer fits its log (DIVERGED).
Recovery lives in ``recovery.py``, the ownership check before a live step in
``ownership.py``.

A run's whole life in this process (admitted or claimed, executed, finished or stopped
for one of the reasons of ``StopReason``, released) reads in one place, next to the
shutdown that ends every run; what can live apart already does (recovery, ownership, the
run table, suspension, waking, timers, messaging).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ...errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    SerializationError,
    WorkflowCancelledError,
    WorkflowDivergedError,
    WorkflowInputsError,
    WorkflowInterruptedError,
)
from ...errors_codec import dumps_error
from ...limits import check_identifier
from ...records import RecoveryReport, WorkflowStatus
from ...storage.database import SystemDatabase
from ...storage.rows import Runner
from ...storage.session import ExecutorSession
from . import tracing
from .context import (
    OwnershipLost,
    StopReason,
    WorkflowContext,
    entered_workflow,
)
from .executors import EventLoop, RoomWatch, WorkerPool
from .notifications import CANCEL_CHANNEL, Notifications
from .outcome import (
    Outcome,
    capture,
    capture_async,
    stored_outcome,
    workflow_outcome,
)
from .plans import Plan, run_plan
from .registry import code_version, workflow_names
from .runs import Claim, RunTable, WorkflowRun
from .suspension import Suspended
from .waiting import finished_outcome

log = logging.getLogger(__name__)

#: Why a claimed run did not start: the workflow moved on before it was registered.
_MOVED_ON = "was run by another run of this process meanwhile, or is no longer this session's"


@dataclass(slots=True)
class PassIntervals:
    """How often each background pass of a process looks for work without being woken
    (seconds). Each is also woken when there is a reason to look (a NOTIFY, an outage
    ending, a run stopping); stress tests shorten them to milliseconds to make the rare
    interleavings of the passes common."""

    #: Take back the workflows this process owns but does not run (recovery.py).
    take_back: float = 30.0
    #: The waker's sweep for what a lost NOTIFY or another process's timer left (waking.py).
    sweep: float = 2.0
    #: Take over the workflows of dead sessions (recovery.py; ``launch(take_over_every=)``).
    take_over: float = 2.0


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
        replay_only: bool = False,
    ) -> None:
        if suspend_after < 0:
            raise ValueError(f"suspend_after must be >= 0 seconds, got {suspend_after}")
        self.db = db
        #: The engine of a replay check (deploy_check.py): it replays logs, never opens a
        #: session, and answers workflow calls from the database without writing.
        self.replay_only = replay_only
        #: A background run whose wait is longer than this (seconds) suspends.
        self.suspend_after = suspend_after
        self.executor_id = check_identifier(executor_id, "executor id")
        self.app_version = app_version
        self.session = ExecutorSession(
            db,
            executor_id,
            app_version,
            lease_seconds,
            grace_seconds=session_grace,
            code_version=code_version,
        )
        self.session_key: int | None = None
        #: Told when a background run ends (see ``free_slots``).
        self.room = RoomWatch()
        self.pool = WorkerPool(workers, on_room=self.room.freed)
        #: Where background async runs execute: one loop, its blocking calls on as many
        #: threads as there are database connections.
        self.loop = EventLoop(io_threads=db.pool_size, max_runs=async_runs, on_room=self.room.freed)
        #: LISTEN/NOTIFY wake-ups for recv, get_event and other waiters (notifications.py).
        self.notifications = Notifications(db)
        #: Set once, when shutdown begins: the one shutdown flag (``stopping`` reads it).
        self._stopped = threading.Event()
        self.recovery_done = threading.Event()
        self.last_recovery: RecoveryReport | None = None
        self._lock = threading.Lock()
        self.runs = RunTable()
        self.notifications.subscribe(CANCEL_CHANNEL, self.note_cancelled)
        #: How often the background passes look unprompted (tests shorten them).
        self.passes = PassIntervals()
        self._background: list[threading.Thread] = []
        self._dispatch_wanted = threading.Event()
        #: Whether the process defined a queue (launch sets it from queues.py; the
        #: machinery does not know the API's queues).
        self.queues_defined: Callable[[], bool] = lambda: False
        #: Woken when this process may own workflows it does not run (after an outage).
        self.take_back_wanted = threading.Event()
        #: The take-back should look at once, without letting stopping runs settle.
        self.take_back_urgent = False
        #: Called when every wait is woken (shutdown, a moved clock): the waker's poke.
        self._wake_hooks: list[Callable[[], None]] = []
        self._shutdown_hooks: list[Callable[[], None]] = []
        self._suspend_hooks: list[Callable[[], None]] = []

    @property
    def stopping(self) -> bool:
        """Whether shutdown has begun: passes and runs stop at their next look."""
        return self._stopped.is_set()

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

    def on_shutdown(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` once the engine has shut down (the launch forgets it then)."""
        self._shutdown_hooks.append(hook)

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

    def start_claimed(self, claims: Sequence[Claim]) -> list[Future[Outcome] | None]:
        """Run, in the background, workflows that a statement just gave this session (a
        wake, a recovery claim, a dequeue, a take-back, a resume or a fork); the future of
        each run, or None where this process does not run it now (a future already done
        with WorkflowInputsError where the recorded inputs no longer fit).

        The one way a claimed workflow starts here, so that no workflow ever runs twice at
        once in this process, and none runs from a stale log: each run is registered in
        the run table first, and only then are the workflows' state and logs read, in one
        query. A workflow another run of this process picked up meanwhile (and perhaps
        suspended or finished again) is no longer PENDING and this session's, or is still
        being run: it is left to that run (and taken back, should that run end without
        finishing it). Recorded inputs that no longer fit the function end the workflow
        ERROR, as they always would; the other claims go on.
        """
        futures: list[Future[Outcome] | None] = [None] * len(claims)
        runs: list[tuple[int, WorkflowRun]] = []
        for index, claim in enumerate(claims):
            registered = self._registered(claim)
            if isinstance(registered, WorkflowRun):
                runs.append((index, registered))
            else:
                futures[index] = registered
        if not runs:
            return futures
        mark = self.ownership_mark()  # the read below confirms ownership in this streak
        try:
            logs = self.db.steps.load_owned([run.workflow_id for _, run in runs], self.session_key)
        except BaseException as exc:
            for _, run in runs:
                self.abandon(run, exc)
            raise
        for index, run in runs:
            recorded = logs.get(run.workflow_id)
            if recorded is None:  # run (and stopped) here meanwhile, or no longer ours
                self.resolve(run, Outcome(error=OwnershipLost(run.workflow_id, _MOVED_ON)))
                continue
            run.recorded, run.owned_streak = recorded, mark
            if run.definition.is_async:
                self.loop.wait_for_room()
            else:
                self.pool.wait_for_room(backlog=self.pool.size * 2)
            futures[index] = self.submit(run)
        return futures

    def _registered(self, claim: Claim) -> WorkflowRun | Future[Outcome] | None:
        """A run of the claimed workflow, registered in the run table. Instead, when its
        inputs are unusable: a done future with that error (the workflow is recorded
        ERROR); when a run of it here is still ending: None (the workflow is taken back
        once that run has ended, if it is still this session's)."""
        definition, workflow_id = claim.definition, claim.workflow_id
        try:
            args, kwargs = definition.inputs.loads(claim.inputs, workflow_id)
        except WorkflowInputsError as exc:
            log.error("cannot run workflow %s: %s", workflow_id, exc)
            self.db.workflows.finish(
                workflow_id, WorkflowStatus.ERROR, None, dumps_error(exc), self.session_key
            )
            unusable: Future[Outcome] = Future()
            unusable.set_result(Outcome(error=exc))
            return unusable
        run = WorkflowRun(definition, workflow_id, args, kwargs, {})
        active = self.runs.claim(run, claim.inputs)
        if active is None:
            return run
        active.future.add_done_callback(lambda _: self.take_back_soon())
        return None

    def take_back_soon(self) -> None:
        """Look now for workflows this session owns but does not run (a claim that came
        while a run of the workflow here was ending, a run cut off by an outage)."""
        self.take_back_urgent = True
        self.take_back_wanted.set()

    def free_slots(self, is_async: bool) -> int:
        """Background runs of that kind this process can start now without queueing them:
        idle worker threads (sync workflows), free event-loop slots (async ones). A pass
        that claims other sessions' workflows claims no more (``self.room`` tells it when
        a run ends)."""
        return self.loop.free() if is_async else self.pool.free()

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
        self.abandon(run, exc)
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
            if reason is StopReason.DIVERGED:
                assert isinstance(stop_error, WorkflowDivergedError)
                return self._stop_diverged(run, stop_error)
            status = WorkflowStatus.SUCCESS
            if reason is StopReason.IN_DOUBT:  # even if user code swallowed the doubt
                outcome, status = Outcome(error=stop_error), WorkflowStatus.IN_DOUBT
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
        self.resolve(run, outcome)
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
        self.abandon(run, why)
        return Outcome(error=why)

    def _stop_diverged(self, run: WorkflowRun, divergence: WorkflowDivergedError) -> Outcome:
        """The code called another step than the log recorded: a code change, never the
        workflow's error. It is held DIVERGED (unfinished, owned by nobody, saying where
        and how), left alone by processes of this code version and continued by one whose
        code fits its log. Its waiters keep waiting; a direct caller gets the divergence.
        """
        code = code_version()
        detail = {
            "position": divergence.seq,
            "recorded": divergence.recorded,
            "called": divergence.current,
            "app_version": self.app_version,
            "code_version": code,
            "at": datetime.now(UTC).isoformat(),
        }
        first_time = self.db.workflows.hold_diverged(
            run.workflow_id, self.session_key, code, json.dumps(detail)
        )
        if first_time is None:  # no longer ours: whoever owns it now decides
            return self._stop_unfinished(run, OwnershipLost(run.workflow_id))
        if first_time:
            log.warning(
                "workflow %s (%s) is held as DIVERGED: %s (code version %s%s). Processes of "
                "this code leave it alone; code that fits its log (an older version still "
                "running, or a fix using da.patched) continues it; or fork it from an "
                "earlier step, or cancel it.",
                run.workflow_id,
                run.definition.name,
                divergence.detail,
                code,
                "" if self.app_version is None else f", application version {self.app_version}",
            )
        self.resolve(
            run,
            Outcome(
                error=WorkflowInterruptedError(
                    f"workflow {run.workflow_id!r} is held as DIVERGED until code that fits "
                    "its log continues it"
                )
            ),
        )
        return Outcome(error=divergence)

    def runner(self) -> Runner:
        """What this process can run, as the statements that give it workflows ask."""
        return Runner(workflow_names(), self.app_version, code_version())

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
        self.resolve(run, outcome)
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
            self.abandon(run, WorkflowCancelledError(f"workflow {run.workflow_id!r} was resumed"))
            return run.future.result()
        outcome = workflow_outcome(
            run.workflow_id, info.status, info.output, info.error, run.definition.result
        )
        self.resolve(run, outcome)
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

    def resolve(self, run: WorkflowRun, outcome: Outcome) -> None:
        """The run ends here with ``outcome``: out of the run table, its future set."""
        self.runs.release(run)
        if self.queues_defined():  # a slot may have freed up (without queues, waking
            self._dispatch_wanted.set()  # the dispatcher costs a thread switch)
        if not run.future.done():
            run.future.set_result(outcome)

    def abandon(self, run: WorkflowRun, exc: BaseException) -> None:
        """This process stops running the workflow without an outcome; it stays PENDING."""
        self.resolve(
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
        except BaseException as exc:  # already resolved by abandon
            self._note_interrupted(run, exc)

    async def _background_async(self, run: WorkflowRun) -> None:
        try:
            await self.execute_async(run)
        except BaseException as exc:  # already resolved by abandon
            self._note_interrupted(run, exc)

    def _note_interrupted(self, run: WorkflowRun, exc: BaseException) -> None:
        if not self.stopping:
            log.error("workflow %s was interrupted: %s", run.workflow_id, exc)

    def wait_for_outcome(
        self, workflow_id: str, timeout: float | None = None, *, direct: bool = False
    ) -> Outcome:
        """Wait until the workflow is finished, by whichever process runs it.

        Waits on the in-process run when there is one, else polls the
        database. A run here that stops without an outcome (taken over,
        shut down, suspended) falls back to the database. A ``direct`` call gets the
        divergence of a workflow held DIVERGED instead of waiting for code that fits.
        Raises TimeoutError.
        """
        return run_plan(self.outcome_of(workflow_id, timeout, direct=direct))

    def outcome_of(
        self, workflow_id: str, timeout: float | None = None, *, direct: bool = False
    ) -> Plan[Outcome]:
        """:meth:`wait_for_outcome` as a plan, for sync and async callers alike."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            outcome = yield from finished_outcome(
                self.db,
                workflow_id,
                remaining,
                lambda: self.active_future(workflow_id),
                held_is_an_answer=direct,
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
        with self._lock:  # the first call sets the flag; a second one sees it set
            if self._stopped.is_set():
                return
            self._stopped.set()
        atexit.unregister(self._shutdown_at_exit)
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
        for hook in self._shutdown_hooks:
            hook()

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
