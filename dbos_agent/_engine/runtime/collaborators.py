"""What the engine is given when it is built, whole: its options, the background passes it
runs, and the queues and schedules the API defined, as the machinery reads them (it does
not import the API).

:class:`EngineOptions` are the launch options the engine itself reads; ``LaunchOptions``
(``_engine/launch_options.py``) extends them with what ``launch`` reads, so each option is
written once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar, Protocol

from ..._limits import check_identifier
from .registry import WorkflowDefinition


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """How the engine of a process runs (the part of ``LaunchOptions`` it reads itself)."""

    # -- Who this process is.
    executor_id: str = "local"
    """The executor it runs as: its PENDING workflows are recovered under this id."""
    app_version: str | None = None
    """The application version recorded on the workflows it starts; a process takes over
    only the workflows of its own version."""

    # -- Threads and tasks.
    workers: int = 16
    """Threads that run background and recovered sync workflows."""
    async_runs: int = 1000
    """Background async workflows share one event loop of this process, as tasks: at most
    this many at once (recovery and wake-ups wait for room); their model calls overlap
    without a thread each."""

    # -- Sessions and failover (see ``LaunchOptions`` for when a session counts as dead).
    lease_seconds: float = 30.0
    """The heartbeat lease of this process's session."""
    session_grace: float = 3.0
    """Seconds a session's advisory lock may be free before the session counts as dead."""
    take_over_every: float = 2.0
    """Seconds between take-over looks (one cheap statement while there is nothing to
    take); it also looks at once when a session ends leaving work or a workflow is resumed
    without an owner."""

    # -- Wake-ups.
    listen: bool | None = None
    """Wake waiting workflows on Postgres' ``NOTIFY``, on a connection of its own that
    ``LISTEN``s (one per process). None (the default): when a direct connection is at hand
    (the database URL is not pooled, or ``session_url`` is given), else poll. False: poll,
    saving that connection; a wake-up then takes up to ``poll_interval``."""
    poll_interval: float = 1.0
    """Seconds between looks for what a ``NOTIFY`` would have said: a waiting workflow
    re-checks its wait this often when nothing LISTENs (ten times as long while LISTEN is
    up, as a guard against a lost NOTIFY), and without LISTEN the waker looks for suspended
    workflows to wake this often too (else every 2 s)."""

    # -- Background work.
    run_queues: bool = True
    """Run the workflows of the queues this process defines, as its free worker slots and
    the queues' limits allow."""
    suspend_after: float = 1.0
    """Waiting costs nothing: a background workflow whose ``sleep``, ``recv`` or
    ``get_event`` would wait longer than this, or whose step would wait longer than this for
    its next attempt (a dependency down, see ``@da.step(give_up_after=)``), is SUSPENDED
    instead of holding a thread, and woken (here or by any process that knows it) when the
    wait can be met."""

    def __post_init__(self) -> None:
        check_identifier(self.executor_id, "executor id")
        if not self.take_over_every > 0:
            raise ValueError(f"take_over_every must be > 0 seconds, got {self.take_over_every!r}")
        if not self.poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {self.poll_interval!r}")
        if not self.suspend_after >= 0:
            raise ValueError(f"suspend_after must be >= 0 seconds, got {self.suspend_after!r}")


class QueueSpec(Protocol):
    """A queue as the dispatcher reads it (``dbos_agent.Queue`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def concurrency(self) -> int | None: ...
    @property
    def worker_concurrency(self) -> int | None: ...
    @property
    def rate_limit(self) -> tuple[int, float] | None: ...
    @property
    def count_suspended(self) -> bool: ...
    @property
    def fair_share(self) -> bool: ...
    @property
    def partitioned(self) -> bool: ...


def no_queues() -> Sequence[QueueSpec]:
    """The queues of an engine built without any (a replay check, a bare test engine)."""
    return ()


class ScheduleTimes(Protocol):
    """The slots of a schedule as the scheduler pass reads them, in UTC (``CronTimes`` of
    ``_engine/schedules/cron.py`` is one)."""

    def next_after(self, moment: datetime) -> datetime | None: ...
    def latest_until(self, moment: datetime) -> datetime | None: ...
    def between(self, after: datetime, until: datetime, limit: int) -> list[datetime]: ...
    def latest_between(self, after: datetime, until: datetime, limit: int) -> list[datetime]: ...


class ScheduleSpec(Protocol):
    """A schedule as the scheduler pass reads it (``dbos_agent``'s ``@scheduled`` makes
    ``Schedule`` records of ``_engine/schedules/definitions.py``)."""

    @property
    def name(self) -> str: ...
    @property
    def times(self) -> ScheduleTimes: ...
    @property
    def cron(self) -> str: ...
    @property
    def timezone(self) -> str: ...
    @property
    def catch_up(self) -> str: ...
    @property
    def catch_up_window(self) -> timedelta: ...
    @property
    def overlap(self) -> str: ...
    @property
    def workflow(self) -> WorkflowDefinition: ...
    @property
    def slot_param(self) -> str: ...


#: The schedules a scheduler pass fires, asked at every look (a schedule defined after
#: launch is fired too).
ScheduleSource = Callable[[], Sequence[ScheduleSpec]]


class BackgroundPass:
    """A loop of the engine (the waker, the dispatcher, the take-over...): made by the
    engine when it is built, from the factory it was given, and run on a daemon thread
    of its own from :meth:`Engine.start` until shutdown. The engine tells every pass what
    concerns them all (:meth:`wake`, :meth:`timer_added`) instead of keeping hook lists."""

    #: The name of its thread.
    thread_name: ClassVar[str] = "dbos-agent-pass"
    #: This pass is the recovery at launch: the engine's recovery is done when it is
    #: (an engine without one counts its recovery done at start).
    recovers_at_launch: ClassVar[bool] = False

    def run(self) -> None:
        """The loop, until the engine stops."""
        raise NotImplementedError

    def wake(self) -> None:
        """Every wait is woken: shutdown began, or the clock was moved. Look again now."""

    def timer_added(self) -> None:
        """A run here suspended its workflow on a timer (the waker sleeps until it)."""
