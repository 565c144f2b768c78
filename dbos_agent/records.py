"""Plain value types shared by every layer: statuses and the read-only views of rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any


class WorkflowStatus(StrEnum):
    """A workflow's lifecycle state, stored as this exact string."""

    PENDING = "PENDING"
    #: Waiting (a sleep, a message, an event) without holding a thread or a session;
    #: woken, it is PENDING again and continues from its log.
    SUSPENDED = "SUSPENDED"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"
    ENQUEUED = "ENQUEUED"
    MAX_RECOVERY_ATTEMPTS_EXCEEDED = "MAX_RECOVERY_ATTEMPTS_EXCEEDED"
    #: Stopped at a non-idempotent step that may or may not have taken effect.
    IN_DOUBT = "IN_DOUBT"
    #: Held, unfinished, because the code called another step than its log recorded (a
    #: code change): code that fits its log continues it (see ``WorkflowInfo.diverged``).
    DIVERGED = "DIVERGED"

    @property
    def finished(self) -> bool:
        """True once the workflow will not run again by itself."""
        return self not in (
            WorkflowStatus.PENDING,
            WorkflowStatus.ENQUEUED,
            WorkflowStatus.SUSPENDED,
            WorkflowStatus.DIVERGED,
        )


class StepStatus(StrEnum):
    """A recorded step's outcome; PENDING is the intent of a non-idempotent step, and
    RETRYING a step waiting for its next attempt after transient failures (its last
    error and attempts so far are on its row, see :class:`RetryInfo`)."""

    PENDING = "PENDING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"
    RETRYING = "RETRYING"

    @property
    def finished(self) -> bool:
        """True when the row holds the step's outcome (replayed, never run again)."""
        return self in (StepStatus.SUCCESS, StepStatus.ERROR)


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """One workflow as stored. ``inputs``/``output``/``error`` are the stored JSON values."""

    workflow_id: str
    name: str
    status: WorkflowStatus
    inputs: Any
    output: Any
    error: dict[str, Any] | None
    executor_id: str
    app_version: str | None
    recovery_attempts: int
    max_recovery_attempts: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    #: What a SUSPENDED workflow waits for (None otherwise).
    waiting_for: WaitInfo | None = None
    #: When its latest run began: steps recorded earlier were replayed by that run.
    run_started_at: datetime | None = None
    #: Where its log and the code parted, the last time they did (a DIVERGED workflow
    #: says why it is held; one continued since keeps it as history).
    diverged: Divergence | None = None
    #: A delayed ENQUEUED workflow is not dequeued before this (database clock); a
    #: delayed start waits SUSPENDED in ``waiting_for`` (``sleep`` until its time).
    delayed_until: datetime | None = None
    #: The step of an unfinished workflow that waits out a failing dependency (the model
    #: API, an MCP server...): what it waits for, since when, its attempts, its next
    #: attempt and its last error. Set whether the workflow is SUSPENDED meanwhile or
    #: waits in the process that runs it.
    retrying: RetryInfo | None = None
    #: What it waits for, in the one classification every tool shows (see
    #: :class:`Waiting`); None while it runs or once it finished. Read by the reads for
    #: people and tools (a handle's ``get_info``, the Client's, the CLI, the web API),
    #: None from the engine's own reads of a row.
    waiting: Waiting | None = None
    #: The partition (tenant) of a partitioned queue it was enqueued on, else None.
    partition_key: str | None = None
    #: Its queue priority (lower is dequeued first; 0 outside a queue).
    priority: int = 0
    #: When a worker took it from its queue (None: not queued, or not dequeued yet).
    dequeued_at: datetime | None = None
    #: The deduplication id it was enqueued with (``Queue.enqueue(..., dedup_id=)``).
    deduplication_id: str | None = None
    #: The workflow it was forked from, and the fork point (None: not a fork).
    forked_from: str | None = None
    forked_from_step: int | None = None
    #: The workflow that started it (``da.start`` in a workflow; a cancel of that one
    #: cancels this one too), None for a workflow started from outside one.
    parent_workflow_id: str | None = None

    def replayed(self, step: StepInfo) -> bool:
        """Whether ``step`` was recorded by an earlier run (the latest one replays it)."""
        return (
            self.run_started_at is not None
            and step.finished_at is not None
            and step.finished_at < self.run_started_at
        )


@dataclass(frozen=True, slots=True)
class WorkflowFilter:
    """Which workflows a bulk action (``Client.cancel_workflows``, ``resume_workflows``,
    ``delete_workflows``) is about: those matching every field given (None: any).
    ``older_than`` counts back from now on the database's clock; ``created_after`` and
    ``created_before`` are times. Every field is a column's equality but for those three,
    so that a new filter on a column is one field here."""

    status: WorkflowStatus | None = None
    name: str | None = None
    queue_name: str | None = None
    executor_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    older_than: timedelta | None = None
    #: The partition (tenant) of a partitioned queue.
    partition_key: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None:  # a str (from untyped code) is checked
            object.__setattr__(self, "status", WorkflowStatus(self.status))
        if self.older_than is not None and self.older_than < timedelta(0):
            raise ValueError(f"older_than must not be negative, got {self.older_than}")

    @property
    def empty(self) -> bool:
        """No field given: it matches every workflow."""
        return all(getattr(self, name) is None for name in self.__slots__)


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a workflow's log and its code parted: at step ``position`` the log recorded
    ``recorded`` and the code called ``called``, in a process of application version
    ``app_version`` and code version ``code_version`` (see ``launch``), at ``at``."""

    position: int
    recorded: str
    called: str
    app_version: str | None
    code_version: str
    at: datetime | None = None

    def describe(self) -> str:
        """One short line, e.g. ``step 0: log 'prepare', code 'audit'``."""
        return f"step {self.position}: log {self.recorded!r}, code {self.called!r}"

    def why(self) -> str:
        """The sentence operators read (``workflows show``, the dashboard), e.g. ``at step
        0 the log recorded 'prepare' but the code (code version 3f2a..., app version v2)
        called 'audit'``."""
        app = "" if self.app_version is None else f", app version {self.app_version}"
        return (
            f"at step {self.position} the log recorded {self.recorded!r} but the code "
            f"(code version {self.code_version}{app}) called {self.called!r}"
        )


#: The topic on which a workflow waits for the decision on its approval request at step
#: N is this prefix + N (_engine/approvals.py): shown as the approval it is.
APPROVAL_TOPIC_PREFIX = "dbos_agent.approval:"

#: The names of the steps the library records for itself (see ``StepInfo.internal``).
INTERNAL_STEP_PREFIX = "dbos_agent."

#: The built-in steps whose intent (a PENDING row, with the wait's deadline) is a wait in
#: progress, not an effect in doubt: a message (``recv``, approvals' decisions included)
#: and another workflow's event (``get_event``). Nothing to resolve: they wait again.
WAIT_STEPS = frozenset({"dbos_agent.recv", "dbos_agent.get_event"})


@dataclass(frozen=True, slots=True)
class WaitInfo:
    """What wakes a suspended workflow: ``kind`` ``sleep`` (at ``until``), ``recv``
    (a message on topic ``name``, or the deadline ``until``), ``event`` (workflow
    ``target`` publishes ``name``, or the deadline), ``child`` (workflow ``target``
    finishes) or ``retry`` (the next attempt of its step ``name``, at ``until``: see
    ``WorkflowInfo.retrying``)."""

    kind: str
    target: str | None
    name: str | None
    until: datetime | None

    def describe(self) -> str:
        """One short line, e.g. ``recv 'approval' until 12:00:03``."""
        until = f" until {self.until:%Y-%m-%d %H:%M:%S}" if self.until is not None else ""
        if self.kind == "sleep":
            return f"sleep{until}"
        topic = self.name or ""
        if self.kind == "recv" and topic.startswith(APPROVAL_TOPIC_PREFIX):
            return f"an approval (step {topic[len(APPROVAL_TOPIC_PREFIX) :]}){until}"
        if self.kind == "recv":
            return f"recv {self.name or '(default topic)'!r}{until}"
        if self.kind == "child":
            return f"the result of {self.target}"
        if self.kind == "retry":
            return f"the next attempt of {self.name}{until}"
        return f"event {self.name!r} of {self.target}{until}"


#: The kinds of :class:`Waiting`, as the CLI's ``--json``, the web API and the dashboard
#: name them.
WAITING_KINDS = (
    "message",
    "approval",
    "timer",
    "child",
    "event",
    "dependency",
    "divergence",
    "orphan",
    "queue",
)


@dataclass(frozen=True, slots=True)
class Waiting:
    """What an unfinished workflow waits for, one classification for every tool, whether
    it waits SUSPENDED or in the process that runs it. ``kind`` is one of
    :data:`WAITING_KINDS`: ``message`` (a ``recv``), ``approval`` (a human's decision on
    a tool call), ``timer`` (a ``sleep``, or a delayed start), ``child`` (a workflow it
    started, to finish), ``event`` (another workflow's ``set_event``), ``dependency`` (a
    step waiting out a failing dependency: ``WorkflowInfo.retrying``), ``divergence``
    (held DIVERGED until code that fits its log takes it), ``orphan`` (PENDING, but no
    live process owns it) or ``queue`` (ENQUEUED: its turn, or its delay). ``text`` says
    it in words (what would follow "waiting for"); ``step`` is the position of the step
    that waits, where one does (for an approval: the ``recv`` that waits for the
    decision, not the request); ``until`` is when the wait ends by itself (a deadline,
    a timer, the next attempt, a delayed start), else None."""

    kind: str
    text: str
    step: int | None = None
    until: datetime | None = None

    def line(self) -> str:
        """``kind: text``, as ``workflows list`` and ``workflows show`` print it."""
        return f"{self.kind}: {self.text}"


@dataclass(frozen=True, slots=True)
class RetryInfo:
    """A step waiting for its next attempt after transient failures: its dependency (the
    model API overloaded, an MCP server down...) is waited out durably, without recording
    an error, until the step's ``give_up_after`` horizon. Times are the database clock's."""

    seq: int
    step: str
    #: What it waits for, as operators read it (``the model API``, ``MCP server 'files'``).
    waiting_for: str
    #: Attempts made so far (all failed).
    attempts: int
    #: When its first attempt started: the horizon counts from here.
    since: datetime
    #: When its next attempt is due (``dbos-agent retry ID`` makes it now).
    next_at: datetime
    #: The last attempt's error, as recorded (``{"type", "message", ...}``).
    last_error: dict[str, Any] | None

    def error_line(self) -> str:
        """The last error in one line: ``Type: message`` (the type's last name), clipped."""
        if not self.last_error:
            return "(no error recorded)"
        kind = str(self.last_error.get("type", "")).rsplit(".", 1)[-1] or "Error"
        message = " ".join(str(self.last_error.get("message", "")).split())
        line = f"{kind}: {message}" if message else kind
        return line if len(line) <= 200 else line[:199] + "…"

    def describe(self) -> str:
        """What it waits for in one line, e.g. ``the model API since 12:00:01 (step 3
        anthropic.messages): attempt 5 failed, next at 12:04:00; last error: ...``."""
        return (
            f"{self.waiting_for} since {self.since:%Y-%m-%d %H:%M:%S} (step {self.seq} "
            f"{self.step}): attempt {self.attempts} failed, next at "
            f"{self.next_at:%Y-%m-%d %H:%M:%S}; last error: {self.error_line()}"
        )

    def summary(self) -> str:
        """The short form for a table, e.g. ``the model API (attempt 5, next 12:04:00)``."""
        return f"{self.waiting_for} (attempt {self.attempts}, next {self.next_at:%H:%M:%S})"


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One recorded step. ``output``/``error`` are the stored JSON values."""

    workflow_id: str
    seq: int
    name: str
    status: StepStatus
    output: Any
    error: dict[str, Any] | None
    attempts: int
    started_at: datetime
    finished_at: datetime | None
    #: The recorded inputs of a non-idempotent step's intent (else None).
    inputs: Any = None
    #: A RETRYING step's wait for its next attempt (else None).
    retry: RetryInfo | None = None

    @property
    def internal(self) -> bool:
        """A step the library records for itself (``dbos_agent.*``: a stream's write, a
        patch's marker, a message received...), not one the user's code defines: the
        tools fold these away unless asked (``workflows steps --all``)."""
        return self.name.startswith(INTERNAL_STEP_PREFIX)

    @property
    def waiting(self) -> bool:
        """A wait in progress (a ``recv`` or ``get_event`` not met yet): PENDING as an
        intent is, but never in doubt (see :data:`WAIT_STEPS`)."""
        return self.status is StepStatus.PENDING and self.name in WAIT_STEPS

    def wait_text(self) -> str:
        """What a wait in progress waits for, in words, e.g. ``waiting for a message on
        topic 'go' until 2026-12-06 12:00:00`` (its inputs say what and its deadline)."""
        found = self.inputs if isinstance(self.inputs, dict) else {}
        deadline = found.get("deadline")
        until = (
            ""
            if not isinstance(deadline, int | float)
            else f" until {datetime.fromtimestamp(deadline, UTC):%Y-%m-%d %H:%M:%S} UTC"
        )
        if self.name == "dbos_agent.get_event":
            return f"waiting for event {found.get('key')!r} of {found.get('workflow_id')}{until}"
        topic = str(found.get("topic") or "")
        if topic.startswith(APPROVAL_TOPIC_PREFIX):
            step = topic[len(APPROVAL_TOPIC_PREFIX) :]
            return f"waiting for the decision on the approval of step {step}{until}"
        on = f"topic {topic!r}" if topic else "the default topic"
        return f"waiting for a message on {on}{until}"

    @property
    def duration_ms(self) -> float | None:
        """Wall time of the step's live execution, retries included."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds() * 1000.0


class SlotOutcome(StrEnum):
    """What became of one slot of a schedule (see _engine/runtime/scheduler.py)."""

    #: Its workflow was started (the workflow id is the schedule's name and the slot).
    FIRED = "fired"
    #: Not run: an earlier run was unfinished and the overlap policy said skip.
    SKIPPED = "skipped"
    #: Waits (``overlap="buffer_one"``) and starts when the unfinished run ends.
    BUFFERED = "buffered"
    #: Waits its turn (``catch_up="all"`` with ``overlap`` ``"skip"`` or ``"buffer_one"``:
    #: slots run in order); nothing is recorded, and it fires once the run before it
    #: ended, unless it fell out of the catch-up window meanwhile.
    WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue as recorded in the database (``Client.queues()``, ``dbos-agent queues list``):
    the limits every process serving it applies. ``source`` says whose they are: ``code``
    (recorded by a launch from ``da.Queue``) or ``operator`` (``Client.set_queue``, which
    wins over the code's until reset)."""

    name: str
    concurrency: int | None
    worker_concurrency: int | None
    rate_limit: tuple[int, float] | None
    count_suspended: bool
    fair_share: bool
    partitioned: bool
    source: str
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as recorded in the database (``da.operations.list_schedules()``, ``dbos-agent
    schedules``). Slots and times are UTC, on the database clock."""

    name: str
    #: The durable workflow each slot runs.
    workflow_name: str
    cron: str
    timezone: str
    catch_up: str
    catch_up_window: timedelta
    overlap: str
    paused: bool
    #: Every slot at or before this was dealt with (fired, skipped, buffered, or passed
    #: over by the catch-up policy or a pause); later slots are still to come (with
    #: ``catch_up="all"`` and ``overlap`` ``"skip"`` or ``"buffer_one"``, it stays behind
    #: the clock while due slots wait their turn).
    handled_through: datetime
    #: The latest slot whose workflow was started, and that workflow.
    last_slot: datetime | None
    last_workflow_id: str | None
    #: The status of ``last_workflow_id`` (None if there is none, or retention deleted it).
    last_status: WorkflowStatus | None
    #: The slot waiting for the unfinished run to end (``overlap="buffer_one"``).
    buffered_slot: datetime | None
    #: How many slots the overlap policy skipped, and the latest of them.
    skipped_slots: int
    last_skipped_slot: datetime | None
    #: How many slots ``catch_up="all"`` passed over without a run (older than the
    #: catch-up window, or beyond its 10,000 latest, when their turn came), and the
    #: latest of them.
    passed_slots: int = 0
    last_passed_slot: datetime | None = None
    #: The next slot that will come due (None while paused).
    next_slot: datetime | None = None


@dataclass(frozen=True, slots=True)
class StepDigest:
    """What a layer that knows a step's output says about it, for people reading a log.

    The operator tools show any workflow's log from the database alone; only the layer
    that wrote a step knows what its output means (e.g. an agent's model reply: its
    text, tokens and cost). ``None`` means "nothing to say"; the tools then fall back
    to the output as JSON.
    """

    summary: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cost_usd: float | None = None


StepDescriber = Callable[[StepInfo], StepDigest | None]
_describers: list[StepDescriber] = []


def register_step_describer(describer: StepDescriber) -> StepDescriber:
    """Add a describer, tried after those registered before it (a second registration of
    the same function does nothing). Returns it, so it can be used as a decorator.

    It lives here, below every layer, so that a higher layer (the agent) can register
    its knowledge and an interface (the CLI) can use it without importing that layer's
    internals."""
    if describer not in _describers:
        _describers.append(describer)
    return describer


def describe_step(step: StepInfo) -> StepDigest | None:
    """The digest of the first registered describer that recognises ``step``, else None."""
    for describer in _describers:
        digest = describer(step)
        if digest is not None:
            return digest
    return None


@dataclass
class RecoveryReport:
    """What one recovery pass did (``Runtime.recovery``, after ``launch()``)."""

    recovered: int = 0
    #: DIVERGED workflows this process's code took up again.
    continued_diverged: int = 0
    dead_lettered: int = 0
    failed_inputs: int = 0
    unknown: int = 0
    seconds: float = 0.0
