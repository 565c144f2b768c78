"""Retention's machinery: deleting finished workflows past an age in short batches
(:func:`collect_garbage`), and the background pass of ``launch(retention=...)`` that
repeats it (:class:`Retention`). What users and the CLI call (``garbage_collect``, the
duration parsers) is ``_engine/retention.py``; see there for what retention deletes.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from ..._durations import format_duration
from ..._storage.database import SystemDatabase
from ..._storage.outages import describe
from ..._storage.retention import GcCounts
from ...records import WorkflowStatus
from .collaborators import BackgroundPass
from .core import Engine

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


def collect_garbage(
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


class Retention(BackgroundPass):
    """The retention thread of ``launch(retention=...)``: :func:`garbage_collect` every
    ``interval`` seconds (default :func:`retention_interval`) with ±10 % jitter, so that
    a fleet started at once does not collect in lockstep. Logs what it deleted and any
    failure (the next round tries again); returns promptly once the runtime stops."""

    thread_name = "dbos-agent-retention"

    def __init__(
        self, engine: Engine, older_than: timedelta, interval: float | None = None
    ) -> None:
        every = retention_interval(older_than) if interval is None else interval
        if every <= 0:
            raise ValueError(f"interval must be positive, got {interval!r}")
        self._engine = engine
        self._older_than = older_than
        self._every = every

    def run(self) -> None:
        engine, older_than, every = self._engine, self._older_than, self._every
        age, every_text = format_duration(older_than), format_duration(timedelta(seconds=every))
        log.info(
            "retention: deleting workflows finished more than %s ago, every ~%s", age, every_text
        )
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
                    report = collect_garbage(engine.db, older_than, stop=lambda: engine.stopping)
                except Exception as exc:
                    if not engine.stopping:
                        log.error(
                            "retention failed (%s); trying again in ~%s",
                            describe(exc),
                            every_text,
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
