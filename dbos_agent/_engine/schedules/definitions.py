"""``@scheduled``: a durable workflow started on a cron schedule, once per slot.

A *slot* is one time the cron expression names. Its workflow's id is the schedule's name
and the slot in UTC (``"reports@2026-12-04T17:30:00Z"``), and its one argument is the slot
(a timezone-aware ``datetime`` in UTC). However many processes define the schedule, a slot
is fired by one transaction that moves the schedule's cursor past it and inserts that
workflow (see ``_storage/schedules.py``): it runs once, and a kill -9 at any moment loses
none. The scheduler pass (``_engine/runtime/scheduler.py``) fires due slots; ``operations.py``
lists, pauses, resumes and backfills schedules, from Python or from the CLI.

Schedules are defined at import time, like the workflows and queues: a process fires the
schedules it defines when it launches (``launch(run_schedules=True)``, the default).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar, get_args

from ..._limits import MAX_IDENTIFIER_BYTES, check_identifier
from ...errors import DbosAgentError, InvalidIdentifierError, ScheduleError
from ..runtime.registry import WorkflowDefinition
from ..runtime.slots import MAX_SLOTS as MAX_SLOTS  # a slot's workflow is the runtime's
from ..runtime.slots import SLOT_ID_BYTES
from ..runtime.slots import slot_inputs as slot_inputs
from ..runtime.slots import slot_workflow_id as slot_workflow_id
from ..workflow import definition_of
from .cron import CronTimes

F = TypeVar("F", bound=Callable[..., Any])
CatchUp = Literal["latest", "all", "none"]
Overlap = Literal["skip", "allow", "buffer_one"]

#: How far back ``catch_up="all"`` fires missed slots, unless the schedule says otherwise.
DEFAULT_CATCH_UP_WINDOW = timedelta(hours=1)

_lock = threading.Lock()
#: ``@scheduled`` schedules by schedule name.
_schedules: dict[str, Schedule] = {}


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as its process defines it: when, what, and its two policies."""

    name: str
    times: CronTimes
    catch_up: CatchUp
    catch_up_window: timedelta
    overlap: Overlap
    workflow: WorkflowDefinition
    #: The workflow's one parameter, which receives the slot.
    slot_param: str

    @property
    def cron(self) -> str:
        return self.times.expression

    @property
    def timezone(self) -> str:
        return self.times.timezone


def scheduled(
    cron: str,
    *,
    name: str | None = None,
    timezone: str = "UTC",
    catch_up: CatchUp = "latest",
    catch_up_window: timedelta = DEFAULT_CATCH_UP_WINDOW,
    overlap: Overlap = "skip",
) -> Callable[[F], F]:
    """Start the decorated durable workflow at every slot of ``cron``, once per slot.

    Put it above ``@durable_workflow``; the workflow takes one argument, the slot (a
    ``datetime`` in UTC; annotate it ``datetime``). ``cron`` has five fields (minute hour
    day month weekday) or six with seconds first; it is read in ``timezone`` (an IANA
    name). ``name`` (default: the workflow's name) identifies the schedule in the database,
    the CLI and the slots' workflow ids.

    After downtime (no process ran the schedule, or the database was down), ``catch_up``
    says which missed slots still run: ``"latest"`` the most recent one, ``"all"`` every
    one within ``catch_up_window`` (at most the latest 10,000), ``"none"`` none (only a
    slot less than a minute late counts as on time).

    ``overlap`` says whether two runs of the schedule may be unfinished at once. With
    ``"allow"`` every slot starts when it is decided. With ``catch_up="all"``, ``"skip"``
    and ``"buffer_one"`` both mean *in order*: each slot starts once the previous run
    ended, oldest first, whether it was missed during downtime or came due on time during
    a long run; none is dropped, except a slot that falls out of ``catch_up_window``
    before its turn, which is passed over and counted (``ScheduleInfo.passed_slots``).
    With ``"latest"`` or ``"none"``, a slot coming due while a run is unfinished is not run
    with ``"skip"`` (counted as skipped), and waits with ``"buffer_one"`` to start when the
    run ends (a slot coming while one already waits is skipped).

    A bad expression, time zone or policy, a function that is not a durable workflow of one
    ``datetime`` argument, or a name another function's schedule has, raises
    :class:`ScheduleError` here, at import time.
    """

    def decorate(fn: F) -> F:
        schedule = define_schedule(
            fn,
            cron,
            name=name,
            timezone=timezone,
            catch_up=catch_up,
            catch_up_window=catch_up_window,
            overlap=overlap,
        )
        register_schedule(schedule)
        return fn

    return decorate


def define_schedule(
    fn: Callable[..., Any],
    cron: str,
    *,
    name: str | None,
    timezone: str,
    catch_up: CatchUp,
    catch_up_window: timedelta,
    overlap: Overlap,
) -> Schedule:
    """Check everything about a schedule before anything is registered."""
    label = f"schedule {name!r}" if name is not None else f"the schedule of {fn!r}"
    try:
        definition = definition_of(fn)
    except DbosAgentError:
        raise ScheduleError(
            f"{label}: {fn!r} is not a durable workflow; put @scheduled above @durable_workflow"
        ) from None
    schedule_name = definition.name if name is None else name
    label = f"schedule {schedule_name!r}"
    try:
        check_identifier(schedule_name, "schedule name")
    except InvalidIdentifierError as exc:
        raise ScheduleError(f"{label}: {exc}") from None
    if len(schedule_name.encode("utf-8", "surrogatepass")) + SLOT_ID_BYTES > MAX_IDENTIFIER_BYTES:
        raise ScheduleError(
            f"{label}: the name is too long to make workflow ids of (name@slot must fit "
            f"in {MAX_IDENTIFIER_BYTES} bytes)"
        )
    try:
        times = CronTimes(cron, timezone)
    except ValueError as exc:
        raise ScheduleError(f"{label}: {exc}") from None
    policies: tuple[tuple[str, object, object], ...] = (
        ("catch_up", catch_up, CatchUp),
        ("overlap", overlap, Overlap),
    )
    for what, value, allowed in policies:  # the annotations do not bind at run time
        if value not in get_args(allowed):
            choices = ", ".join(repr(a) for a in get_args(allowed))
            raise ScheduleError(f"{label}: {what} must be one of {choices}, got {value!r}")
    if not isinstance(catch_up_window, timedelta) or catch_up_window <= timedelta(0):
        raise ScheduleError(
            f"{label}: catch_up_window must be a positive timedelta, got {catch_up_window!r}"
        )
    return Schedule(
        name=schedule_name,
        times=times,
        catch_up=catch_up,
        catch_up_window=catch_up_window,
        overlap=overlap,
        workflow=definition,
        slot_param=_slot_param(definition, label),
    )


def _slot_param(definition: WorkflowDefinition, label: str) -> str:
    """The workflow's one parameter: it must take the slot, as a ``datetime``."""
    try:
        signature = inspect.signature(definition.fn, eval_str=True)
    except Exception as exc:  # an annotation that does not resolve
        raise ScheduleError(
            f"{label}: cannot read the signature of workflow {definition.name!r}: {exc}"
        ) from None
    params = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) != 1 or params[0].kind not in positional:
        raise ScheduleError(
            f"{label}: workflow {definition.name!r} must take exactly one argument, the "
            f"scheduled time (a datetime); its signature is {signature}"
        )
    if params[0].annotation is not datetime:
        raise ScheduleError(
            f"{label}: annotate the parameter {params[0].name!r} of workflow "
            f"{definition.name!r} as datetime, so that the slot comes back as one on replay"
        )
    return params[0].name


def register_schedule(schedule: Schedule) -> None:
    """Register ``schedule`` in this process; a name may not belong to two functions (the
    same function defined again, a module reloaded, replaces itself)."""
    with _lock:
        existing = _schedules.get(schedule.name)
        if existing is not None and existing.workflow.origin != schedule.workflow.origin:
            raise ScheduleError(
                f"two schedules are named {schedule.name!r}: one runs "
                f"{existing.workflow.origin}, the other {schedule.workflow.origin}; give one "
                f"of them another name with @scheduled(..., name=...)"
            )
        _schedules[schedule.name] = schedule


def registered_schedules() -> list[Schedule]:
    """Every schedule defined in this process."""
    with _lock:
        return list(_schedules.values())


def find_schedule(name: str) -> Schedule | None:
    """The schedule of that name defined in this process, if any."""
    return _schedules.get(name)


def forget_schedules(*names: str) -> None:
    """Forget the named schedules, or every one (for tests that define them on the fly:
    a later launch in the same process must not fire them)."""
    with _lock:
        if not names:
            _schedules.clear()
        for name in names:
            _schedules.pop(name, None)
