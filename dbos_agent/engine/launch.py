"""``launch()``: the one place where a process's runtime is put together.

It connects to the system database, applies the schema, registers the executor
session, and starts the engine's background work: the notification listener,
recovery of this executor's pending workflows, taking back what this process owns
but no longer runs, taking over what dead sessions left, the queue dispatcher, the
scheduler of the cron schedules it defines and, if asked, retention. What it returns,
:class:`Runtime`, is the narrow public handle on that engine: what it is, how its
recovery went, and how to stop it. The plumbing (the database, the pool, the run
table) stays inside the engine.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import TracebackType

from ..errors import DbosAgentError
from ..limits import DEFAULT_MAX_CHECKPOINT_BYTES, check_identifier
from ..postgres.embedded import resolve_url
from ..records import RecoveryReport
from ..storage.database import SystemDatabase
from ..storage.dsn import redact_url
from ..storage.outages import DEFAULT_OUTAGE_TIMEOUT_S
from .queues import any_queue, registered_queues, run_dispatcher
from .retention import check_older_than, run_retention
from .runtime.core import Engine
from .runtime.engine import clear_engine, current_engine, launch_lock, launched, set_engine
from .runtime.recovery import keep_taking_back, keep_taking_over, recover_pending
from .runtime.waking import Waker
from .scheduler import Scheduler
from .schedules import registered_schedules


def launch(
    database_url: str | None = None,
    *,
    executor_id: str = "local",
    app_version: str | None = None,
    recover: bool = True,
    workers: int = 16,
    pool_size: int | None = None,
    lease_seconds: float = 30.0,
    session_grace: float = 3.0,
    outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT_S,
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    run_queues: bool = True,
    retention: timedelta | None = None,
    take_over: bool = True,
    take_over_every: float = 2.0,
    suspend_after: float = 1.0,
    wake_suspended: bool = True,
    async_runs: int = 1000,
    run_schedules: bool = True,
) -> Runtime:
    """Connect to the system database, apply the schema, and recover pending workflows.

    ``database_url`` defaults to ``$DBOS_AGENT_DATABASE_URL`` and then to an
    embedded Postgres kept under ``./.dbos_agent/``. Recovery of this
    executor's PENDING workflows runs in the background: ``launch`` returns
    at once. ``workers`` bounds the threads that run background and recovered sync
    workflows; ``pool_size`` the database connections (default: workers + 4).
    Background async workflows share one event loop of this process instead, as
    tasks (at most ``async_runs`` at once; recovery and wake-ups wait for room): their
    model calls overlap without a thread each.

    Taking over: other executors take this process's workflows over only once
    its session is dead: its heartbeat lease (``lease_seconds``) ran out (a hung
    or partitioned process), or its advisory lock has been free for longer than
    ``session_grace`` seconds (a dead process; a live one whose connection
    dropped re-opens it within moments and keeps its workflows). A process on
    the same host that sees the pid gone does not wait at all.

    Outages: every database call is retried through an outage for up to
    ``outage_timeout`` seconds before raising DatabaseUnavailableError; a
    workflow cut off by one stays PENDING and this process takes it back when
    the database answers. ``max_checkpoint_bytes`` bounds one stored JSON value
    (a step output, a workflow's inputs or output, a message, an event).

    With ``run_queues`` this process also runs the workflows of the queues it
    defines, as its free worker slots and the queues' limits allow.

    With ``run_schedules`` this process also fires the slots of the cron schedules it
    defines (``@scheduled``, defined before launch), each slot once across every process
    that defines them (see engine/scheduler.py).

    With ``retention`` (e.g. ``timedelta(days=30)``) this process also deletes
    finished workflows (SUCCESS, ERROR, CANCELLED, dead letters) older than that,
    with their steps, messages and events, in the background: every tenth of
    ``retention`` and at least hourly, in short batches (see engine/retention.py).
    Without it nothing is ever deleted.

    Waiting costs nothing: a workflow run in the background (``da.start``, recovery,
    a queue) whose ``sleep``, ``recv`` or ``get_event`` would wait longer than
    ``suspend_after`` seconds is SUSPENDED instead of holding a thread, and this
    process (or any other that knows the workflow) wakes it and continues it from
    its log when the wait can be met (see engine/suspension.py). With
    ``wake_suspended=False`` this process wakes none (e.g. a web process that only
    starts workflows; its workers wake them).

    Failover: every launched process takes over the workflows of dead sessions, of
    any executor, that it can run (a registered name, its application version): it
    looks every ``take_over_every`` seconds (one cheap statement while there is
    nothing to take) and at once when a session ends leaving work or a workflow is
    resumed without an owner. A fleet of application processes needs no separate
    worker to survive the death of one of them. ``take_over=False`` leaves that to
    others (the process still recovers its own executor's workflows at launch).
    """

    if retention is not None:
        check_older_than(retention)  # a bad age fails here, not in a background thread
    if not take_over_every > 0:
        raise ValueError(f"take_over_every must be > 0 seconds, got {take_over_every!r}")

    with launch_lock():
        if launched() is not None:
            raise DbosAgentError(
                "dbos_agent is already launched in this process; "
                "call shutdown() on the runtime first"
            )
        check_identifier(executor_id, "executor id")
        url = resolve_url(database_url)
        db = SystemDatabase(
            url,
            pool_size=pool_size or workers + 4,
            outage_timeout=outage_timeout,
            max_checkpoint_bytes=max_checkpoint_bytes,
        )
        db.open()
        try:
            db.migrate()
            engine = Engine(
                db,
                executor_id=executor_id,
                app_version=app_version,
                workers=workers,
                lease_seconds=lease_seconds,
                session_grace=session_grace,
                suspend_after=suspend_after,
                async_runs=async_runs,
            )
            engine.queues_defined = any_queue
            if run_queues:  # registered from its first moment as serving them
                engine.session.queues = [queue.name for queue in registered_queues()]
            engine.open()
        except BaseException:
            db.close()
            raise
        set_engine(engine)
        engine.on_shutdown(lambda: clear_engine(engine))
    waker = Waker(engine) if wake_suspended else None
    if waker is not None:
        waker.start()
        engine.on_wake_all(waker.poke)
        engine.on_suspended(lambda: waker.poke(sweep=False))  # a new timer: sleep until it
    engine.notifications.start()
    if recover:
        engine.run_in_background(lambda: recover_pending(engine), "dbos-agent-recovery")
    else:
        engine.recovery_done.set()
    engine.run_in_background(lambda: keep_taking_back(engine), "dbos-agent-take-back")
    if waker is not None:
        engine.run_in_background(waker.run, "dbos-agent-waker")
    if run_queues:
        engine.run_in_background(lambda: run_dispatcher(engine), "dbos-agent-dispatcher")
    if run_schedules and registered_schedules():
        scheduler = Scheduler(engine)
        engine.on_wake_all(scheduler.poke)  # a moved clock, shutdown: look again now
        engine.run_in_background(scheduler.run, "dbos-agent-scheduler")
    if take_over:
        engine.passes.take_over = take_over_every
        engine.run_in_background(lambda: keep_taking_over(engine), "dbos-agent-take-over")
    if retention is not None:
        age = retention
        engine.run_in_background(lambda: run_retention(engine, age), "dbos-agent-retention")
    return Runtime(engine)


def current_runtime() -> Runtime:
    """The runtime this process launched (NotLaunchedError if none)."""
    return Runtime(current_engine())


class Runtime:
    """This process's launched dbos_agent: returned by :func:`launch`.

    Use it as a context manager (``with`` or ``async with``), or call :meth:`shutdown`;
    a runtime never shut down is shut down when the interpreter exits. Handles of the
    same launch compare equal.
    """

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def executor_id(self) -> str:
        """The executor this process runs as (its workflows are recovered under it)."""
        return self._engine.executor_id

    @property
    def app_version(self) -> str | None:
        """The application version recorded on the workflows this process starts."""
        return self._engine.app_version

    @property
    def database_url(self) -> str:
        """The system database, with any password masked."""
        return redact_url(self._engine.db.url)

    @property
    def last_recovery(self) -> RecoveryReport | None:
        """What recovery at launch did, once it is done (None before, or if skipped)."""
        return self._engine.last_recovery

    def wait_for_recovery(self, timeout: float | None = None) -> RecoveryReport | None:
        """Wait until recovery at launch is done and return its report.

        Raises TimeoutError if it is not done within ``timeout`` seconds.
        """
        if not self._engine.recovery_done.wait(timeout):
            raise TimeoutError(f"recovery not done within {timeout} s")
        return self._engine.last_recovery

    @property
    def session_key(self) -> int | None:
        """The key of this process's executor session (workflows it owns carry it)."""
        return self._engine.session_key

    def running(self) -> list[str]:
        """The ids of the workflows this process runs now."""
        return self._engine.active_ids()

    def shutdown(self, grace: float = 10.0) -> None:
        """Stop taking work; running workflows stop at their next step and stay PENDING.

        Waits up to ``grace`` seconds for them, then ends the executor session (its
        unfinished workflows are claimable by others at once) and closes the database
        connections. A second call does nothing.
        """
        self._engine.shutdown(grace)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Runtime) and other._engine is self._engine

    def __hash__(self) -> int:
        return id(self._engine)

    def __repr__(self) -> str:
        return f"<Runtime executor_id={self.executor_id!r} database={self.database_url!r}>"

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
