"""Where the running workflow and step are kept: context variables.

Context variables follow ``asyncio`` tasks and ``contextvars.copy_context()``,
so steps find their workflow without any argument threading through user code.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ..._limits import check_identifier
from ..._storage.rows import StepEffect, StepRow
from ...errors import (
    DatabaseUnavailableError,
    DbosAgentError,
    PatchError,
    WorkflowDivergedError,
)

log = logging.getLogger(__name__)

V = TypeVar("V")

if TYPE_CHECKING:
    from ..._storage.database import SystemDatabase
    from ..._storage.session import ExecutorSession
    from ...errors import WorkflowCancelledError
    from .notifications import Notifications


class WorkflowHost(Protocol):
    """What a running workflow and its steps may use of the process that runs them (the
    engine): the database, the session whose fence guards live steps, the waiters."""

    db: SystemDatabase
    session: ExecutorSession
    session_key: int | None
    notifications: Notifications
    #: A background run whose wait is longer than this (seconds) suspends.
    suspend_after: float
    #: A replay check's engine: it runs nothing live (see deploy_check.py).
    replay_only: bool

    @property
    def stopping(self) -> bool:
        """Whether the process is shutting down."""
        ...

    def cancellation(self, workflow_id: str) -> WorkflowCancelledError | None:
        """The error that stops a run of ``workflow_id`` if it was cancelled, else None."""
        ...

    def note_suspended(self, wake_at: float | None) -> None:
        """A run of this process suspended its workflow (with a timer at ``wake_at``)."""
        ...


class RuntimeStopping(BaseException):
    """Raised at a step boundary while the runtime shuts down.

    A BaseException so that user code catching ``Exception`` does not swallow
    it; the workflow stays PENDING and is recovered by the next process.
    """


class OwnershipLost(BaseException):
    """This session no longer runs the workflow (taken over, or finished elsewhere).

    The run stops quietly and records nothing: the owner, or the stored outcome, counts.
    """

    def __init__(
        self, workflow_id: str, detail: str = "was taken over by another executor session"
    ) -> None:
        super().__init__(f"workflow {workflow_id!r} {detail}")


class PastLog(BaseException):
    """A replay check reached the end of the workflow's log (or a wait): the code fits
    the log up to here. A BaseException, so that user code does not swallow it."""

    def __init__(self, workflow_id: str, seq: int) -> None:
        super().__init__(f"the replay of workflow {workflow_id!r} reached position {seq}")
        self.seq = seq


class StopReason(IntEnum):
    """Why a run ends before its workflow function returns, strongest first.

    Once set, no further step starts (user code cannot swallow it), and
    :meth:`Engine.finish` acts on the strongest reason seen.
    """

    #: The code no longer fits the log: the workflow ends ERROR with the divergence.
    DIVERGED = 1
    #: A non-idempotent step may or may not have happened: the workflow ends IN_DOUBT.
    IN_DOUBT = 2
    #: An operator cancelled it: the cancel recorded the outcome; the run records nothing.
    CANCELLED = 3
    #: Another session owns it now, or it finished elsewhere: the run records nothing.
    NOT_OWNER = 4
    #: The database failed under the log: nothing is recorded, the workflow stays
    #: PENDING and this process takes it back once the database answers.
    DATABASE = 5
    #: The process lacks configuration (a model client, an API key): nothing is
    #: recorded, the workflow stays PENDING for a process that has it.
    UNCONFIGURED = 6
    #: A background run gave its workflow up while it waits (SUSPENDED in the
    #: database, see suspension.py): nothing more is recorded by this run.
    SUSPENDED = 7
    #: A replay check (``dbos-agent check-deploy``) reached the end of the log: what the
    #: code does from there would run live, and a check runs nothing live.
    PAST_LOG = 8


@dataclass(eq=False)
class WorkflowContext:
    """The state of one workflow execution in this process."""

    workflow_id: str
    engine: WorkflowHost
    recorded: dict[int, StepRow]
    #: The session streak in which this run last knew it owned the workflow (see
    #: ownership.py); -1 until it has checked.
    owned_streak: int = -1
    stop_reason: StopReason | None = None
    stop_error: BaseException | None = None
    #: A background run (a thread of the pool, not a caller's): its long waits suspend.
    suspendable: bool = False
    #: The thread of the event loop an async run's body runs on (None: a sync run).
    loop_thread: int | None = None
    _next_seq: int = 0
    _live_steps: int = 0
    _waits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: One past the last recorded position: from there on the run is live.
    _log_end: int = 0
    #: Patches this run has met: name -> (call site, the branch it took), see patches.py.
    _patches: dict[str, tuple[tuple[str, int], bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._log_end = max(self.recorded, default=-1) + 1

    def halt(self, reason: StopReason, error: BaseException) -> BaseException:
        """Note why the run must end (the strongest reason wins); returns what to raise."""
        with self._lock:
            if self.stop_reason is None or reason < self.stop_reason:
                self.stop_reason, self.stop_error = reason, error
        return error

    def noting_database_failures(self) -> AbstractContextManager[None]:
        """A failed log write or an outage past its bound ends the run unfinished (for
        recovery), even if user code catches the error and carries on."""
        return _NotingDatabaseFailures(self)

    def running_step(self) -> AbstractContextManager[None]:
        """Count a step running live for the block: a run never suspends while one of its
        steps (in another thread, or another task) is still running."""
        return _RunningStep(self)

    def count_live_step(self, delta: int) -> None:
        """A step began (+1) or ended (-1) running live (see :meth:`running_step`)."""
        with self._lock:
            self._live_steps += delta

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Count a durable wait in progress for the block (sleep, recv, get_event)."""
        with self._lock:
            self._waits += 1
        try:
            yield
        finally:
            with self._lock:
                self._waits -= 1

    def may_suspend(self, *, own_step: bool = False) -> bool:
        """Whether this run may give its workflow up to wait (see suspension.py): a
        background run, with no step running (but the waiting one itself, for a step
        that waits for its next attempt: ``own_step``) and no other wait (a suspended
        workflow records one wake-up condition, so two waits at once stay in memory)."""
        with self._lock:
            return (
                self.suspendable
                and self._live_steps == (1 if own_step else 0)
                and self._waits <= 1
                and self.stop_reason is None
            )

    def next_position(self) -> int:
        """Hand out the next step position (thread-safe: positions are call order)."""
        return self.reserve(1).start

    def reserve(self, count: int) -> range:
        """Hand out ``count`` consecutive positions at once, for steps that run
        concurrently: each takes its own (see :func:`at_position`), so the log does not
        depend on which of them starts or finishes first."""
        with self._lock:
            base = self._next_seq
            self._next_seq += count
        return range(base, base + count)

    def check_not_stopped(self) -> None:
        """Raise if the run must end: shutdown, a stop noted earlier, or a cancel."""
        if self.engine.stopping:
            raise RuntimeStopping()
        if self.stop_error is not None:
            raise self.stop_error
        cancelled = self.engine.cancellation(self.workflow_id)
        if cancelled is not None:
            raise self.halt(StopReason.CANCELLED, cancelled)

    def begin_step(self, name: str) -> tuple[int, StepRow | None]:
        """Take a position for step ``name``; return its recorded row when replaying."""
        self.check_not_stopped()
        seq = _pinned_position.get()
        if seq is None:
            seq = self.next_position()
        else:  # one step per reserved position
            _pinned_position.set(None)
        recorded = self.recorded.pop(seq, None)
        if recorded is not None and recorded.name != name:
            raise self.halt(
                StopReason.DIVERGED,
                WorkflowDivergedError(self.workflow_id, seq, recorded.name, name),
            )
        if self.engine.replay_only and (recorded is None or not recorded.status.finished):
            raise self.stop_past_log(seq)  # it would run live (or resolve an intent) here
        return seq, recorded

    def stop_past_log(self, seq: int | None = None) -> BaseException:
        """Note that a replay check reached the end of the log (at ``seq``, by default
        the next position); returns what to raise."""
        with self._lock:
            at = self._next_seq if seq is None else seq
        return self.halt(StopReason.PAST_LOG, PastLog(self.workflow_id, at))

    def next_recorded(self) -> StepRow | None:
        """What the log recorded at the next position, if anything: the next step replays
        (or resolves an intent) instead of running live."""
        with self._lock:
            return self.recorded.get(self._next_seq)

    def positions_taken(self) -> int:
        """How many positions the run has handed out (replayed ones included)."""
        with self._lock:
            return self._next_seq

    def live_from_here(self) -> bool:
        """Whether the next position is past the end of the log (the run is live there)."""
        with self._lock:
            return self._next_seq >= self._log_end

    def patch_seen(self, name: str, site: tuple[str, int]) -> bool | None:
        """The branch patch ``name`` took at ``site`` earlier in this run (None: not met
        yet); a PatchError if this run met the name at another call site."""
        with self._lock:
            seen = self._patches.get(name)
        if seen is None:
            return None
        if seen[0] != site:
            where = f"{seen[0][0]}:{seen[0][1]}"
            raise PatchError(
                f"patch name {name!r} is used at two places in workflow "
                f"{self.workflow_id!r}: {where} and {site[0]}:{site[1]}; give each change "
                "its own name"
            )
        return seen[1]

    def note_patch(self, name: str, site: tuple[str, int], took: bool) -> None:
        """Patch ``name`` was met at ``site`` and took the new branch (``took``) or not."""
        with self._lock:
            self._patches.setdefault(name, (site, took))


class _NotingDatabaseFailures:
    """:meth:`WorkflowContext.noting_database_failures` (a class: these blocks are on every
    step's path, where a generator-based context manager costs several times more)."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: WorkflowContext) -> None:
        self._ctx = ctx

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, DatabaseUnavailableError):
            self._ctx.halt(StopReason.DATABASE, exc)


class _RunningStep:
    """:meth:`WorkflowContext.running_step`."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: WorkflowContext) -> None:
        self._ctx = ctx

    def __enter__(self) -> None:
        self._ctx.count_live_step(1)

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self._ctx.count_live_step(-1)


class _Bound(Generic[V]):
    """A context variable set to a value for a with-block, which gets the value."""

    __slots__ = ("_token", "_value", "_var")

    def __init__(self, var: ContextVar[V | None], value: V) -> None:
        self._var = var
        self._value = value

    def __enter__(self) -> V:
        self._token = self._var.set(self._value)
        return self._value

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self._var.reset(self._token)


@dataclass(eq=False)
class Attempt:
    """One attempt of a step running live: what stream items written inside it are
    tagged with (see streams.py), what to do when it fails (void what it wrote), and the
    writes it asked for that happen only with its checkpoint (``effects``: set_event and
    close_stream inside a step), dropped with it when it fails."""

    seq: int
    number: int
    #: The step's name and how many attempts it gets (for :func:`step_info`).
    name: str = ""
    max_attempts: int = 1
    _id: str | None = None
    _voids: dict[str, Callable[[], object]] = field(default_factory=dict)
    effects: list[StepEffect] = field(default_factory=list)

    @property
    def id(self) -> str:
        """A tag unique to this attempt (made when first asked: most attempts never are)."""
        if self._id is None:
            self._id = uuid.uuid4().hex
        return self._id

    def on_void(self, name: str, callback: Callable[[], object]) -> None:
        """Call ``callback`` if this attempt fails (once per ``name``)."""
        self._voids.setdefault(name, callback)

    @property
    def wrote(self) -> bool:
        """Whether anything asked to be voided if this attempt fails."""
        return bool(self._voids)

    def void(self) -> None:
        """The attempt failed: run the callbacks (a failing one is logged, not raised:
        the next attempt's first write voids the items anyway)."""
        for name, callback in self._voids.items():
            try:
                callback()
            except Exception as exc:
                log.warning(
                    "could not void %s of a failed attempt of step %d: %s", name, self.seq, exc
                )


_current_workflow: ContextVar[WorkflowContext | None] = ContextVar(
    "dbos_agent_workflow", default=None
)
_current_step: ContextVar[int | None] = ContextVar("dbos_agent_step", default=None)
_assigned_workflow_id: ContextVar[str | None] = ContextVar(
    "dbos_agent_assigned_workflow_id", default=None
)
_workflow_timeout: ContextVar[float | None] = ContextVar(
    "dbos_agent_workflow_timeout", default=None
)
_pinned_position: ContextVar[int | None] = ContextVar("dbos_agent_pinned_position", default=None)
_current_attempt: ContextVar[Attempt | None] = ContextVar("dbos_agent_attempt", default=None)


def current_context() -> WorkflowContext | None:
    """The workflow running in this context, if any."""
    return _current_workflow.get()


def in_step() -> bool:
    """True while a step function is executing (nested steps then run plainly)."""
    return _current_step.get() is not None


@contextmanager
def entered_workflow(ctx: WorkflowContext) -> Iterator[WorkflowContext]:
    """Make ``ctx`` the current workflow (and no step current) for the block."""
    wf_token = _current_workflow.set(ctx)
    step_token = _current_step.set(None)
    pin_token = _pinned_position.set(None)
    timeout_token = _workflow_timeout.set(None)  # its own children end with it anyway
    id_token = _assigned_workflow_id.set(None)  # the caller's block named this workflow
    try:
        yield ctx
    finally:
        _assigned_workflow_id.reset(id_token)
        _workflow_timeout.reset(timeout_token)
        _pinned_position.reset(pin_token)
        _current_step.reset(step_token)
        _current_workflow.reset(wf_token)


def reserve_positions(count: int) -> list[int | None]:
    """Positions for ``count`` steps about to run concurrently, in the order they were
    asked for (all None outside a workflow, or inside a step, where steps are plain calls).
    """
    ctx = _current_workflow.get()
    if ctx is None or _current_step.get() is not None:
        return [None] * count
    return list(ctx.reserve(count))


@contextmanager
def at_position(seq: int | None) -> Iterator[None]:
    """The first step begun in this block, in this thread or task, takes position ``seq``
    (one of :func:`reserve_positions`); None changes nothing. Run each concurrent call in
    its own context (a task, ``contextvars.copy_context().run``)."""
    token = _pinned_position.set(seq)
    try:
        yield
    finally:
        _pinned_position.reset(token)


def entered_attempt(
    seq: int, number: int, name: str = "", max_attempts: int = 1
) -> AbstractContextManager[Attempt]:
    """Mark attempt ``number`` (of ``max_attempts``) of step ``seq`` as running for the
    block."""
    return _Bound(_current_attempt, Attempt(seq, number, name, max_attempts))


@dataclass(frozen=True, slots=True)
class RunningStep:
    """What ``da.step_info()`` says about the step running here."""

    workflow_id: str
    #: The step's position in its workflow's log (its ``seq``, as ``list_steps`` shows).
    position: int
    name: str
    #: 1 for the first attempt, 2 for the first retry...
    attempt: int
    #: 1 + the step's ``retries`` (a step with a ``give_up_after`` horizon may make more
    #: attempts while its errors are transient).
    max_attempts: int


def current_attempt() -> Attempt | None:
    """The step attempt running here, if any."""
    return _current_attempt.get()


def entered_step(seq: int) -> AbstractContextManager[int]:
    """Mark step ``seq`` as executing for the block."""
    return _Bound(_current_step, seq)


def current_workflow_id() -> str | None:
    """The id of the workflow running here, or None outside any workflow."""
    ctx = _current_workflow.get()
    return ctx.workflow_id if ctx else None


def step_key() -> str:
    """A stable idempotency key for the running step: the same on every replay.

    Pass it to external APIs (e.g. an ``Idempotency-Key`` header) so that a
    step re-run after a crash is deduplicated by the receiving side.
    """
    ctx = _current_workflow.get()
    seq = _current_step.get()
    if ctx is None or seq is None:
        raise DbosAgentError("step_key() is only available inside a step of a durable workflow")
    return f"{ctx.workflow_id}:{seq}"


@contextmanager
def workflow_id(value: str) -> Iterator[None]:
    """Run the durable workflows called in this block under the id ``value``.

    A second call with the same id returns the recorded result and runs nothing.
    """
    check_identifier(value, "workflow id")
    token = _assigned_workflow_id.set(value)
    try:
        yield
    finally:
        _assigned_workflow_id.reset(token)


@contextmanager
def workflow_timeout(seconds: float | None) -> Iterator[None]:
    """Give the workflows started in this block (called, ``da.start``-ed, enqueued) a
    deadline ``seconds`` from their first start, on the database clock.

    Unfinished at its deadline, a workflow is cancelled (its ``result()`` raises
    :class:`WorkflowTimeoutError`), and so are the workflows it started; a run stops at
    its next step. A restart or a recovery keeps the first start's deadline. Deadlines
    are enforced by the waker of a process launched with ``wake_suspended`` (every
    launched process by default), within about two seconds. ``None`` sets no deadline.
    """
    if seconds is not None and not (isinstance(seconds, int | float) and 0 < seconds < 1e9):
        raise ValueError(
            f"workflow_timeout: seconds must be a number > 0 (and finite), got {seconds!r}"
        )
    token = _workflow_timeout.set(None if seconds is None else float(seconds))
    try:
        yield
    finally:
        _workflow_timeout.reset(token)


def current_workflow_timeout() -> float | None:
    """The timeout a workflow started here gets (see :func:`workflow_timeout`)."""
    return _workflow_timeout.get()


def assigned_workflow_id() -> str | None:
    """The id set by the innermost ``with workflow_id(...)`` block, if any."""
    return _assigned_workflow_id.get()


def take_workflow_id(explicit: str | None = None) -> str:
    """The id for a new top-level workflow: explicit, assigned by the block, or fresh.

    An explicit id is checked (an empty one is refused, never replaced by a fresh one).
    """
    if explicit is not None:
        return check_identifier(explicit, "workflow id")
    return _assigned_workflow_id.get() or str(uuid.uuid4())
