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
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Any

from .._storage.dsn import redact_url
from ..errors import DbosAgentError
from ..postgres.opening import open_system_database
from ..records import RecoveryReport
from .launch_options import LaunchOptions, option_names, takes_launch_options
from .queues import registered_queues
from .runtime.core import Engine, PassFactory
from .runtime.current import clear_engine, current_engine, launch_lock, launched, set_engine
from .runtime.dispatcher import Dispatcher
from .runtime.queue_settings import DatabaseQueues
from .runtime.recovery import RecoverAtLaunch, TakeBack, TakeOver
from .runtime.retention import Retention
from .runtime.scheduler import Scheduler
from .runtime.waking import Waker
from .schedules import registered_schedules

#: Why launch() is refused in this process (None: it is not), see :func:`refuse_launch`.
_refused: str | None = None


def refuse_launch(reason: str) -> None:
    """Make every later :func:`launch` in this process raise DbosAgentError(``reason``):
    ``check-deploy``'s process imports the app to replay its code, and a runtime launched
    there (by a module that launches at import) would run workflows live."""
    global _refused
    _refused = reason


@takes_launch_options
def launch(
    database_url: str | None = None, options: LaunchOptions | None = None, **keywords: Any
) -> Runtime:
    """Connect to the system database, apply the schema, and recover pending workflows.

    ``database_url`` defaults to ``$DBOS_AGENT_DATABASE_URL`` and then to an
    embedded Postgres kept under ``./.dbos_agent/``. The rest is
    :class:`~dbos_agent.LaunchOptions`, given as ``options`` or as keywords
    (``launch(url, workers=32)``); keywords given with ``options`` replace those fields.
    Recovery, failover, queues, schedules, suspension and retention then run in the
    background: ``launch`` returns at once, with this process's :class:`Runtime`.
    """

    if _refused is not None:
        raise DbosAgentError(_refused)
    unknown = sorted(set(keywords) - option_names())
    if unknown:
        raise TypeError(f"launch() got unknown options {unknown}; see LaunchOptions")
    o = replace(options or LaunchOptions(), **keywords)  # checked when made

    with launch_lock():
        if launched() is not None:
            raise DbosAgentError(
                "dbos_agent is already launched in this process; "
                "call shutdown() on the runtime first"
            )
        db = open_system_database(  # the application: it may create and migrate
            database_url,
            create=True,
            migrate=True,
            pool_size=o.pool_size or o.workers + 4,
            outage_timeout=o.outage_timeout,
            max_checkpoint_bytes=o.max_checkpoint_bytes,
            session_url=o.session_url,
        )
        try:
            engine = Engine(
                db,
                o,
                queues=DatabaseQueues(db, registered_queues),
                passes=_passes(o),
                on_shutdown=clear_engine,
            ).open()
        except BaseException:
            db.close()
            raise
        set_engine(engine)
    engine.start()
    return Runtime(engine)


def _passes(o: LaunchOptions) -> list[PassFactory]:
    """The background passes the options ask for, in the order they start."""
    passes: list[PassFactory] = []
    if o.recover:
        passes.append(RecoverAtLaunch)
    passes.append(TakeBack)
    if o.wake_suspended:
        passes.append(Waker)
    if o.run_queues:
        passes.append(Dispatcher)
    if o.run_schedules and registered_schedules():
        passes.append(partial(Scheduler, schedules=registered_schedules))
    if o.takes_over:
        passes.append(TakeOver)
    if o.retention is not None:
        passes.append(partial(Retention, older_than=o.retention))
    return passes


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
