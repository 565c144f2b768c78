"""What :func:`~dbos_agent.launch` may be told, said once: :class:`LaunchOptions`.

``launch(url, workers=32)`` and ``launch(url, LaunchOptions(workers=32))`` are the same
call. The options live here, each with its default and what it does, grouped by what
they are about; :class:`LaunchKeywords` only lets a type checker check the keyword form
(a unit test keeps it equal to the dataclass's fields).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import timedelta
from typing import TypedDict

from ..limits import DEFAULT_MAX_CHECKPOINT_BYTES
from ..storage.outages import DEFAULT_OUTAGE_TIMEOUT_S
from .retention import check_older_than

__all__ = ["LaunchKeywords", "LaunchOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchOptions:
    """How a process runs its dbos_agent (see :func:`~dbos_agent.launch`).

    Checked when made: a bad ``retention`` or ``take_over_every`` fails here, not in a
    background thread.
    """

    # -- Who this process is.
    executor_id: str = "local"
    """The executor it runs as: its PENDING workflows are recovered under this id."""
    app_version: str | None = None
    """The application version recorded on the workflows it starts; a process takes over
    only the workflows of its own version."""

    # -- Threads, tasks and connections.
    workers: int = 16
    """Threads that run background and recovered sync workflows."""
    pool_size: int | None = None
    """Database connections (default: ``workers + 4``)."""
    async_runs: int = 1000
    """Background async workflows share one event loop of this process, as tasks: at most
    this many at once (recovery and wake-ups wait for room); their model calls overlap
    without a thread each."""

    # -- Sessions and failover. Other executors take this process's workflows over only
    # once its session is dead: its heartbeat lease ran out (a hung or partitioned
    # process), or its advisory lock has been free for longer than ``session_grace`` (a
    # dead process; a live one whose connection dropped re-opens it within moments and
    # keeps its workflows). A process on the same host that sees the pid gone does not
    # wait at all.
    recover: bool = True
    """Recover this executor's PENDING workflows at launch, in the background (``launch``
    returns at once). False: this process resumes no workflow it did not start itself:
    it recovers nothing at launch and, unless ``take_over=True`` is given, takes over
    nothing either (it still runs its queues' workflows and wakes suspended ones, as
    ``run_queues`` and ``wake_suspended`` say)."""
    lease_seconds: float = 30.0
    """The heartbeat lease of this process's session."""
    session_grace: float = 3.0
    """Seconds a session's advisory lock may be free before the session counts as dead."""
    take_over: bool | None = None
    """Take over the workflows of dead sessions, of any executor, that this process can
    run (a registered name, its application version), as many as it can start at once
    (idle worker threads, free event-loop slots; the rest is left to peers with room): a
    fleet of application processes needs no separate worker to survive the death of one.
    False leaves that to others. None (the default) follows ``recover``: on, unless
    ``recover=False``; ``recover=False, take_over=True`` takes over without recovering
    at launch."""
    take_over_every: float = 2.0
    """Seconds between take-over looks (one cheap statement while there is nothing to
    take); it also looks at once when a session ends leaving work or a workflow is resumed
    without an owner."""

    # -- The database.
    outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT_S
    """Every database call is retried through an outage for up to this many seconds before
    raising DatabaseUnavailableError; a workflow cut off by one stays PENDING and this
    process takes it back when the database answers."""
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
    """The largest stored JSON value (a step output, a workflow's inputs or output, a
    message, an event)."""

    # -- Background work.
    run_queues: bool = True
    """Run the workflows of the queues this process defines, as its free worker slots and
    the queues' limits allow."""
    run_schedules: bool = True
    """Fire the slots of the cron schedules this process defines (``@scheduled``, defined
    before launch), each slot once across every process that defines them."""
    suspend_after: float = 1.0
    """Waiting costs nothing: a background workflow whose ``sleep``, ``recv`` or
    ``get_event`` would wait longer than this, or whose step would wait longer than this for
    its next attempt (a dependency down, see ``@da.step(give_up_after=)``), is SUSPENDED
    instead of holding a thread, and woken (here or by any process that knows it) when the
    wait can be met."""
    wake_suspended: bool = True
    """Wake suspended workflows here; False for, e.g., a web process that only starts
    workflows (its workers wake them)."""
    retention: timedelta | None = None
    """Delete finished workflows (SUCCESS, ERROR, CANCELLED, dead letters) older than this,
    with their steps, messages and events, in the background: every tenth of it and at
    least hourly, in short batches (engine/retention.py). None: nothing is ever deleted."""

    @property
    def takes_over(self) -> bool:
        """Whether the process takes over dead sessions' workflows: ``take_over`` if
        given, else ``recover``."""
        return self.recover if self.take_over is None else self.take_over

    def __post_init__(self) -> None:
        if self.retention is not None:
            check_older_than(self.retention)
        if not self.take_over_every > 0:
            raise ValueError(f"take_over_every must be > 0 seconds, got {self.take_over_every!r}")


class LaunchKeywords(TypedDict, total=False):
    """The keyword form of :class:`LaunchOptions` (for type checkers: the fields' names and
    types, nothing else)."""

    executor_id: str
    app_version: str | None
    workers: int
    pool_size: int | None
    async_runs: int
    recover: bool
    lease_seconds: float
    session_grace: float
    take_over: bool | None
    take_over_every: float
    outage_timeout: float
    max_checkpoint_bytes: int
    run_queues: bool
    run_schedules: bool
    suspend_after: float
    wake_suspended: bool
    retention: timedelta | None


def option_names() -> frozenset[str]:
    """The names of the launch options."""
    return frozenset(field.name for field in fields(LaunchOptions))
