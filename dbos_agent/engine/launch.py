"""``launch()``: the one place where a process's runtime is put together.

It connects to the system database, applies the schema, registers the executor
session, and starts the runtime's background work: the notification listener,
recovery of this executor's pending workflows, taking back what this process owns
but no longer runs, the queue dispatcher and, if asked, retention.
"""

from __future__ import annotations

from datetime import timedelta

from ..errors import DbosAgentError
from ..limits import DEFAULT_MAX_CHECKPOINT_BYTES, check_identifier
from ..storage.database import SystemDatabase
from ..storage.embedded import resolve_url
from ..storage.outages import DEFAULT_OUTAGE_TIMEOUT_S
from . import state
from .queues import run_dispatcher
from .recovery import keep_taking_back, recover_pending
from .retention import check_older_than, run_retention
from .runtime import Runtime


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
) -> Runtime:
    """Connect to the system database, apply the schema, and recover pending workflows.

    ``database_url`` defaults to ``$DBOS_AGENT_DATABASE_URL`` and then to an
    embedded Postgres kept under ``./.dbos_agent/``. Recovery of this
    executor's PENDING workflows runs in the background: ``launch`` returns
    at once. ``workers`` bounds the threads that run background and recovered
    workflows; ``pool_size`` the database connections (default: workers + 4).

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

    With ``retention`` (e.g. ``timedelta(days=30)``) this process also deletes
    finished workflows (SUCCESS, ERROR, CANCELLED, dead letters) older than that,
    with their steps, messages and events, in the background: every tenth of
    ``retention`` and at least hourly, in short batches (see engine/retention.py).
    Without it nothing is ever deleted.
    """

    if retention is not None:
        check_older_than(retention)  # a bad age fails here, not in a background thread

    with state.lock():
        if state.launched() is not None:
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
            runtime = Runtime(
                db,
                executor_id=executor_id,
                app_version=app_version,
                workers=workers,
                lease_seconds=lease_seconds,
                session_grace=session_grace,
            )
            runtime.open()
        except BaseException:
            db.close()
            raise
        state.set_runtime(runtime)
    runtime.notifications.start()
    if recover:
        runtime.run_in_background(lambda: recover_pending(runtime), "dbos-agent-recovery")
    else:
        runtime.recovery_done.set()
    runtime.run_in_background(lambda: keep_taking_back(runtime), "dbos-agent-take-back")
    if run_queues:
        runtime.run_in_background(lambda: run_dispatcher(runtime), "dbos-agent-dispatcher")
    if retention is not None:
        age = retention
        runtime.run_in_background(lambda: run_retention(runtime, age), "dbos-agent-retention")
    return runtime
