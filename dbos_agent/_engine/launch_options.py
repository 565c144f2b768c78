"""What :func:`~dbos_agent.launch` may be told, said once: :class:`LaunchOptions`.

``launch(url, workers=32)`` and ``launch(url, LaunchOptions(workers=32))`` are the same
call. Each option is written once, with its default and what it does: those the engine
reads itself in :class:`~dbos_agent._engine.runtime.collaborators.EngineOptions` (who the
process is, its threads, its session, queues and suspension), the rest here. The keyword
form's types are the dataclass's own: :func:`takes_launch_options` gives ``launch`` the
signature of :class:`_LaunchCall`'s constructor, for type checkers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import ParamSpec, TypeVar

from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES
from .._storage.outages import DEFAULT_OUTAGE_TIMEOUT_S
from .runtime.collaborators import EngineOptions
from .runtime.retention import check_older_than

__all__ = ["LaunchOptions"]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchOptions(EngineOptions):
    """How a process runs its dbos_agent (see :func:`~dbos_agent.launch`): the engine's
    options (:class:`~dbos_agent._engine.runtime.collaborators.EngineOptions`: who it is,
    ``workers``, ``async_runs``, ``lease_seconds``, ``session_grace``,
    ``take_over_every``, ``run_queues``, ``suspend_after``) and these.

    Checked when made: a bad ``retention`` or ``take_over_every`` fails here, not in a
    background thread.
    """

    # -- Connections. A process opens at most ``pool_size`` connections for its statements
    # (opened as they are needed, kept while idle), one for its executor session (its
    # advisory lock and heartbeat) and one that LISTENs (see ``listen``): ``workers + 6``
    # by default. Through a transaction pooler (a database URL with ``?pooler=transaction``)
    # these are connections to the pooler, which holds a server connection only for the
    # length of each transaction; with ``session_url`` the session's and the listener's
    # go to the server directly (2 per process), without it there are none: the session is
    # judged by its lease alone and waits poll (docs/pooled-urls.md).
    pool_size: int | None = None
    """Database connections for statements (default: ``workers + 4``)."""
    session_url: str | None = None
    """A direct URL of the system database (default: ``$DBOS_AGENT_SESSION_URL``), for what
    a transaction pooler cannot carry when the database URL goes through one: the executor
    session's advisory lock, ``LISTEN`` and migrations at launch. Without it such a process
    is judged alive by its lease alone (a dead one's workflows are taken over once
    ``lease_seconds`` ran out, not ``session_grace``), polls for wake-ups, and does not
    migrate (run ``dbos-agent migrate`` with a direct URL first). A pooled URL here is
    refused (PoolerError)."""

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
    take_over: bool | None = None
    """Take over the workflows of dead sessions, of any executor, that this process can
    run (a registered name, its application version), as many as it can start at once
    (idle worker threads, free event-loop slots; the rest is left to peers with room): a
    fleet of application processes needs no separate worker to survive the death of one.
    False leaves that to others. None (the default) follows ``recover``: on, unless
    ``recover=False``; ``recover=False, take_over=True`` takes over without recovering
    at launch."""

    # -- The database.
    outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT_S
    """Every database call is retried through an outage for up to this many seconds before
    raising DatabaseUnavailableError; a workflow cut off by one stays PENDING and this
    process takes it back when the database answers."""
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
    """The largest stored JSON value (a step output, a workflow's inputs or output, a
    message, an event)."""

    # -- Background work.
    run_schedules: bool = True
    """Fire the slots of the cron schedules this process defines (``@scheduled``, defined
    before launch), each slot once across every process that defines them."""
    wake_suspended: bool = True
    """Wake suspended workflows here; False for, e.g., a web process that only starts
    workflows (its workers wake them)."""
    retention: timedelta | None = None
    """Delete finished workflows (SUCCESS, ERROR, CANCELLED, dead letters) older than this,
    with their steps, messages and events, in the background: every tenth of it and at
    least hourly, in short batches (_engine/runtime/retention.py). None: nothing is ever deleted."""

    @property
    def takes_over(self) -> bool:
        """Whether the process takes over dead sessions' workflows: ``take_over`` if
        given, else ``recover``."""
        return self.recover if self.take_over is None else self.take_over

    def __post_init__(self) -> None:
        EngineOptions.__post_init__(self)  # (a slots dataclass has no zero-argument super)
        if self.retention is not None:
            check_older_than(self.retention)


@dataclass(frozen=True, slots=True)
class _LaunchCall(LaunchOptions):
    """``launch``'s parameters, for type checkers only (never made): its two positional
    ones, then every option as a keyword (the dataclass puts keyword-only fields last)."""

    database_url: str | None = None
    options: LaunchOptions | None = None


def _signature_of(made: Callable[P, object]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    def typed(fn: Callable[..., R]) -> Callable[P, R]:
        return fn

    return typed


#: Gives ``launch`` the signature of :class:`_LaunchCall` (type checkers see every option
#: as a keyword of its own type, from the one definition of the options).
takes_launch_options = _signature_of(_LaunchCall)


def option_names() -> frozenset[str]:
    """The names of the launch options."""
    return frozenset(field.name for field in fields(LaunchOptions))
