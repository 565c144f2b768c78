"""The engine: one per process, created by :func:`launch` behind its public handle.

It owns the system database, the executor session, the worker pool and the
table of workflows this process is running, and it is where a claimed workflow is
started (``start_claimed``: the one way a wake, a recovery claim, a dequeue, a take-back
or an operator action starts a run) and executed, next to the shutdown that ends every
run. It is built whole (``collaborators.py``): its options, the queues the API defined
and the background passes it runs are given to its constructor.

What can live apart does: admission (idempotent start) in ``admission.py``, how a run
ends (recorded, or stopped for one of the reasons of ``StopReason``) in ``endings.py``,
recovery and take-over in ``recovery.py``, the ownership check before a live step in
``ownership.py``, the run table, suspension, waking, the dispatcher.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from ..._errors_codec import dumps_error
from ..._storage.database import SystemDatabase
from ..._storage.rows import Runner
from ..._storage.session import ExecutorSession
from ...errors import (
    PoolerError,
    WorkflowCancelledError,
    WorkflowInputsError,
    WorkflowInterruptedError,
)
from ...records import RecoveryReport, WorkflowStatus
from . import tracing
from .collaborators import BackgroundPass, EngineOptions, QueueSpec, no_queues
from .context import (
    OwnershipLost,
    WorkflowContext,
    entered_workflow,
)
from .endings import Endings
from .executors import EventLoop, RoomWatch, Wanted, WorkerPool
from .notifications import CANCEL_CHANNEL, Notifications
from .outcome import (
    Outcome,
    capture,
    capture_async,
)
from .plans import Plan, run_plan
from .registry import code_version, workflow_names
from .runs import Claim, RunTable, WorkflowRun
from .waiting import finished_outcome

log = logging.getLogger(__name__)

#: Why a claimed run did not start: the workflow moved on before it was registered.
_MOVED_ON = "was run by another run of this process meanwhile, or is no longer this session's"


@dataclass(frozen=True, slots=True)
class PassIntervals:
    """How often each background pass of a process looks for work without being woken
    (seconds). Each is also woken when there is a reason to look (a NOTIFY, an outage
    ending, a run stopping); stress tests shorten them to milliseconds to make the rare
    interleavings of the passes common (:meth:`Engine.run_passes_every`)."""

    #: Take back the workflows this process owns but does not run (recovery.py).
    take_back: float = 30.0
    #: The waker's sweep for what a lost NOTIFY or another process's timer left (waking.py).
    sweep: float = 2.0  # with LISTEN; without, EngineOptions.poll_interval
    #: Take over the workflows of dead sessions (recovery.py; ``launch(take_over_every=)``).
    take_over: float = 2.0


_DEFAULTS = EngineOptions()
_LISTENING_SWEEP_S = PassIntervals().sweep
#: What makes one of the engine's background passes, given the engine being built.
PassFactory = Callable[["Engine"], BackgroundPass]


def _listens(db: SystemDatabase, options: EngineOptions) -> bool:
    """Whether this process LISTENs (``EngineOptions.listen``): never without a direct
    connection, where asking for it is refused."""
    if options.listen and db.direct is None:
        raise PoolerError(
            f"listen=True needs a direct connection, and the database URL {db.redacted_url} "
            f"goes through a pooler: give launch() the server's direct URL as session_url "
            f"($DBOS_AGENT_SESSION_URL), or leave listen unset to poll"
        )
    return db.direct is not None if options.listen is None else options.listen


class Engine:
    """Runs durable workflows against one system database.

    Built whole: its options, the queues the API defined, the background passes it runs
    (made here, from their factories) and what to do once it has shut down are given to
    the constructor, and nothing is attached to it afterwards. ``open`` registers its
    session; ``start`` starts its listener and its passes.
    """

    def __init__(
        self,
        db: SystemDatabase,
        options: EngineOptions = _DEFAULTS,
        *,
        queues: Callable[[], Sequence[QueueSpec]] = no_queues,
        passes: Sequence[PassFactory] = (),
        on_shutdown: Callable[[Engine], None] | None = None,
        replay_only: bool = False,
    ) -> None:
        self.db = db
        self.options = options
        #: The engine of a replay check (deploy_check.py): it replays logs, never opens a
        #: session, and answers workflow calls from the database without writing.
        self.replay_only = replay_only
        #: A background run whose wait is longer than this (seconds) suspends.
        self.suspend_after = options.suspend_after
        self.executor_id = options.executor_id
        self.app_version = options.app_version
        #: The queues this process defined (the machinery does not import the API's).
        self.queues = queues
        self.session = ExecutorSession(
            db,
            options.executor_id,
            options.app_version,
            options.lease_seconds,
            grace_seconds=options.session_grace,
            code_version=code_version,
            queues=self._served_queues,
        )
        self.session_key: int | None = None
        #: Told when a background run ends (see ``free_slots``).
        self.room = RoomWatch()
        self.pool = WorkerPool(options.workers, on_room=self.room.freed)
        #: Where background async runs execute: one loop, its blocking calls on as many
        #: threads as there are database connections.
        self.loop = EventLoop(
            io_threads=db.pool_size, max_runs=options.async_runs, on_room=self.room.freed
        )
        #: LISTEN/NOTIFY wake-ups for recv, get_event and other waiters (notifications.py).
        self.notifications = Notifications(
            db, poll_interval=options.poll_interval, listen=_listens(db, options)
        )
        #: Set once, when shutdown begins: the one shutdown flag (``stopping`` reads it).
        self._stopped = threading.Event()
        self.recovery_done = threading.Event()
        self._last_recovery: RecoveryReport | None = None
        self._lock = threading.Lock()
        self.runs = RunTable()
        self.notifications.subscribe(CANCEL_CHANNEL, self.note_cancelled)
        #: How often the background passes look unprompted (tests shorten them); without
        #: LISTEN the waker's sweep is how suspended workflows learn of what woke them.
        self.passes = PassIntervals(
            sweep=options.poll_interval if self.notifications.polls else _LISTENING_SWEEP_S,
            take_over=options.take_over_every,
        )
        self._background: list[threading.Thread] = []
        self._dispatch_wanted = threading.Event()
        #: Woken when this process may own workflows it does not run (after an outage);
        #: urgent: look at once, without letting stopping runs settle.
        self.take_back_wanted = Wanted()
        self._on_shutdown = on_shutdown
        self.endings = Endings(
            db,
            self.runs,
            app_version=options.app_version,
            owner_key=lambda: self.session_key,
            released=self._run_released,
            take_back=self.take_back_wanted,
        )
        #: Last: each pass is made with the engine whole but for them.
        self._passes = tuple(make(self) for make in passes)

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

    def run_passes_every(self, seconds: float) -> None:
        """Make each background pass look every ``seconds`` whether or not something woke
        it, from its next round on (``dbos_agent.testing.run_passes_every``)."""
        if not seconds > 0:
            raise ValueError(f"run_passes_every: seconds must be > 0, got {seconds!r}")
        self.passes = PassIntervals(seconds, seconds, seconds)
        self.take_back_wanted.set()

    @property
    def last_recovery(self) -> RecoveryReport | None:
        """What recovery at launch did, once it is done (None before, or if skipped)."""
        return self._last_recovery

    def note_recovered(self, report: RecoveryReport) -> None:
        """Recovery at launch is done (recovery.py), with what it did."""
        self._last_recovery = report
        self.recovery_done.set()

    def note_suspended(self, wake_at: float | None) -> None:
        """A run of this process suspended its workflow (see suspension.py): a timer
        tells the passes (the waker then sleeps until the earliest one)."""
        if wake_at is not None:
            for background in self._passes:
                background.timer_added()

    def _wake_everything(self) -> None:
        self.notifications.wake_all()
        self.wake_dispatcher()
        for background in self._passes:
            background.wake()

    def _run_released(self) -> None:
        if self.queues():  # a slot may have freed up (without queues, waking
            self._dispatch_wanted.set()  # the dispatcher costs a thread switch)

    def _served_queues(self) -> list[str]:
        """The queues this process dequeues from, as its heartbeat says."""
        return [queue.name for queue in self.queues()] if self.options.run_queues else []

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
                self.endings.abandon(run, exc)
            raise
        for index, run in runs:
            recorded = logs.get(run.workflow_id)
            if recorded is None:  # run (and stopped) here meanwhile, or no longer ours
                self.endings.resolve(run, Outcome(error=OwnershipLost(run.workflow_id, _MOVED_ON)))
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
        self.take_back_wanted.set(urgent=True)

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
            return self.endings.finish(run, ctx, outcome)
        except BaseException as exc:
            return self.endings.ended_early(run, exc)

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
            return await asyncio.to_thread(self.endings.finish, run, ctx, outcome)
        except BaseException as exc:
            return self.endings.ended_early(run, exc)

    def runner(self) -> Runner:
        """What this process can run, as the statements that give it workflows ask."""
        return Runner(workflow_names(), self.app_version, code_version())

    def parked_ids(self) -> list[str]:
        """Workflows this process will not take back by itself (see ``RunTable.park``)."""
        return self.runs.parked()

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

    def start(self) -> None:
        """Start listening for notifications, and each background pass on its thread (an
        engine without a recovery at launch counts its recovery done now)."""
        self.notifications.start()
        if not any(background.recovers_at_launch for background in self._passes):
            self.recovery_done.set()
        for background in self._passes:
            self.run_in_background(background.run, background.thread_name)

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
        for background in self._passes:
            background.wake()
        for thread in self._background:
            thread.join(grace)
        wait_futures(self.runs.futures(), timeout=grace)
        self.loop.stop()
        self.pool.stop()
        self.session.close()
        self.db.close()
        if self._on_shutdown is not None:
            self._on_shutdown(self)

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
