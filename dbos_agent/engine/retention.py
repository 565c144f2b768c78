"""Retention: delete finished workflows past an age, with their steps, messages and events.

Nothing else ever deletes a workflow, so without retention the tables only grow.
Only workflows that will not run again by themselves go: SUCCESS, ERROR,
CANCELLED and dead letters (MAX_RECOVERY_ATTEMPTS_EXCEEDED). PENDING and ENQUEUED
ones may still run, and an IN_DOUBT one waits for a person to resolve it, so those
are refused at any age.

The work is done in batches of ``batch_size`` workflows, each one statement and
so one short transaction (``delete_finished_workflows`` in ``queries.sql``): a
purge of millions of rows never holds locks, a snapshot or a huge WAL record
for long, and running workflows keep going while it runs. :func:`run_retention`
repeats it in the background (``launch(retention=...)``, ``dbos-agent worker
--retention``); ``dbos-agent gc`` runs it once from the command line.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ..errors import InvalidDurationError
from ..records import WorkflowStatus
from ..storage.database import SystemDatabase
from ..storage.outages import describe
from ..storage.retention import GcCounts
from .runtime.core import Engine
from .runtime.engine import current_engine

log = logging.getLogger(__name__)

#: What retention deletes unless told otherwise: every status that never runs again.
DEFAULT_STATUSES: tuple[WorkflowStatus, ...] = (
    WorkflowStatus.SUCCESS,
    WorkflowStatus.ERROR,
    WorkflowStatus.CANCELLED,
    WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED,
)
DEFAULT_BATCH_SIZE = 1000
#: The background runner runs at least this often (and every older_than / 10 if shorter).
MAX_INTERVAL_S = 3600.0
_JITTER = 0.1

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_UNIT_S = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str, *, unit_required: bool = False) -> timedelta:
    """A duration as people type it: ``45s``, ``90m``, ``12h``, ``30d``, ``2w``, ``1.5h``,
    or bare seconds (``3600``, unless ``unit_required``). Never zero."""
    match = _DURATION.match(text.strip().lower())
    if match is None or (unit_required and not match[2]):
        raise InvalidDurationError(
            f"{text!r} is not a duration: use 45s, 90m, 12h, 30d, 2w"
            + ("" if unit_required else " or a number of seconds")
        )
    try:
        duration = timedelta(seconds=float(match[1]) * _UNIT_S.get(match[2], 1))
    except OverflowError:
        raise InvalidDurationError(f"{text!r} is too long a duration") from None
    if duration <= timedelta(0):
        raise InvalidDurationError(f"{text!r}: a duration must be longer than 0")
    return duration


def parse_moment(text: str) -> datetime:
    """A moment as people type it: an ISO time (UTC unless it says otherwise) or a
    duration ago (``30m``, ``2h``, ``7d``). The CLI's ``--since`` and the API's ``since``
    read it alike."""
    try:
        return datetime.now(UTC) - parse_duration(text, unit_required=True)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidDurationError(
            f"{text!r} is neither an ISO time (2026-12-02, 2026-12-02T17:30Z) "
            f"nor a duration ago (90s, 30m, 2h, 7d, 1w)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def format_duration(duration: timedelta) -> str:
    """The shortest exact spelling :func:`parse_duration` reads back: 30d, 90m, 2.5s."""
    seconds = duration.total_seconds()
    for unit, size in _UNIT_S.items():
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True, slots=True)
class GcReport:
    """What one garbage collection deleted (or, with ``dry_run``, would delete).

    ``batches`` is the number of delete statements (transactions) it ran; a dry run
    says how many a real run would take now. ``seconds`` is its wall time.
    """

    workflows: int
    steps: int
    messages: int
    events: int
    batches: int
    seconds: float
    dry_run: bool


def _report(counts: GcCounts, batches: int, started: float, *, dry_run: bool) -> GcReport:
    return GcReport(
        counts.workflows,
        counts.steps,
        counts.messages,
        counts.events,
        batches,
        time.monotonic() - started,
        dry_run,
    )


def check_older_than(older_than: timedelta) -> float:
    """``older_than`` in seconds; a zero or negative age (everything, at once) is refused."""
    seconds = older_than.total_seconds()
    if seconds <= 0:
        raise ValueError(f"older_than must be a positive duration, got {older_than!r}")
    return seconds


def check_statuses(statuses: Iterable[WorkflowStatus | str]) -> tuple[WorkflowStatus, ...]:
    """The statuses to delete, checked: unknown ones and those that may still run or wait
    for a person (PENDING, ENQUEUED, IN_DOUBT) raise ValueError naming them."""
    if isinstance(statuses, str):  # one status, not its letters
        statuses = (statuses,)
    checked: list[WorkflowStatus] = []
    for value in statuses:
        try:
            status = WorkflowStatus(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a workflow status; choose from {', '.join(DEFAULT_STATUSES)}"
            ) from None
        if not status.finished or status is WorkflowStatus.IN_DOUBT:
            raise ValueError(
                f"{status} workflows are never garbage-collected (they may still run or wait "
                f"to be resolved); choose from {', '.join(DEFAULT_STATUSES)}"
            )
        if status not in checked:
            checked.append(status)
    if not checked:
        raise ValueError("statuses is empty: name at least one status to delete")
    return tuple(checked)


def garbage_collect(
    older_than: timedelta,
    *,
    statuses: Iterable[WorkflowStatus | str] = DEFAULT_STATUSES,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    progress: Callable[[GcReport], None] | None = None,
) -> GcReport:
    """Delete the workflows with one of ``statuses`` that finished more than ``older_than``
    ago (database clock), with their steps, messages and events, on the launched engine.

    Works in batches of ``batch_size`` workflows, oldest first, each its own short
    transaction, until a batch deletes fewer (what is left is locked, or younger).
    ``progress`` gets the running totals after every batch. ``dry_run`` deletes
    nothing and reports what would be deleted now. Raises ValueError for a bad
    argument (see :func:`check_statuses`), before touching the database.
    """
    return garbage_collect_db(
        current_engine().db,
        older_than,
        statuses=statuses,
        batch_size=batch_size,
        dry_run=dry_run,
        progress=progress,
    )


def garbage_collect_db(
    db: SystemDatabase,
    older_than: timedelta,
    *,
    statuses: Iterable[WorkflowStatus | str] = DEFAULT_STATUSES,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    progress: Callable[[GcReport], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> GcReport:
    """:func:`garbage_collect` on a database without a runtime (the CLI). ``stop`` is
    asked before every batch: a shutting-down runner ends between two batches."""
    older_than_s = check_older_than(older_than)
    chosen = check_statuses(statuses)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
    started = time.monotonic()
    if dry_run:
        found = db.retention.count(older_than_s=older_than_s, statuses=chosen)
        return _report(found, found.workflows // batch_size + 1, started, dry_run=True)
    total, batches = GcCounts(), 0
    while stop is None or not stop():
        deleted = db.retention.delete_batch(
            older_than_s=older_than_s, statuses=chosen, batch_size=batch_size
        )
        total, batches = total + deleted, batches + 1
        if progress is not None:
            progress(_report(total, batches, started, dry_run=False))
        if deleted.workflows < batch_size:
            break
    return _report(total, batches, started, dry_run=False)


def retention_interval(older_than: timedelta) -> float:
    """Seconds between two background collections: a tenth of the age, at most an hour
    (a workflow then outlives its age by at most ~10 %, and a long age costs one
    cheap statement an hour)."""
    return min(check_older_than(older_than) / 10, MAX_INTERVAL_S)


def run_retention(engine: Engine, older_than: timedelta, interval: float | None = None) -> None:
    """The retention thread of ``launch(retention=...)``: :func:`garbage_collect` every
    ``interval`` seconds (default :func:`retention_interval`) with ±10 % jitter, so that
    a fleet started at once does not collect in lockstep. Logs what it deleted and any
    failure (the next round tries again); returns promptly once the runtime stops."""
    every = retention_interval(older_than) if interval is None else interval
    if every <= 0:
        raise ValueError(f"interval must be positive, got {interval!r}")
    age, every_text = format_duration(older_than), format_duration(timedelta(seconds=every))
    log.info("retention: deleting workflows finished more than %s ago, every ~%s", age, every_text)
    # A waiter on no channel is woken by shutdown (and, harmlessly, by a reconnect of
    # the listener): the wait ends the moment the runtime stops, however long it is.
    with engine.notifications.waiter() as shutdown:
        while not engine.stopping:
            deadline = time.monotonic() + every * random.uniform(1 - _JITTER, 1 + _JITTER)
            while not engine.stopping and (left := deadline - time.monotonic()) > 0:
                shutdown.wait(left)
            if engine.stopping:
                return
            try:
                report = garbage_collect_db(engine.db, older_than, stop=lambda: engine.stopping)
            except Exception as exc:
                if not engine.stopping:
                    log.error(
                        "retention failed (%s); trying again in ~%s", describe(exc), every_text
                    )
                continue
            if report.workflows:
                log.info(
                    "retention: deleted %d workflow(s) finished more than %s ago, with %d "
                    "step(s), %d message(s), %d event(s), in %d batch(es), %.1fs",
                    report.workflows,
                    age,
                    report.steps,
                    report.messages,
                    report.events,
                    report.batches,
                    report.seconds,
                )
