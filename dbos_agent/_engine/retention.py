"""Retention: delete finished workflows past an age, with their steps, messages and events.

Nothing else ever deletes a workflow, so without retention the tables only grow.
Only workflows that will not run again by themselves go: SUCCESS, ERROR,
CANCELLED and dead letters (MAX_RECOVERY_ATTEMPTS_EXCEEDED). PENDING and ENQUEUED
ones may still run, and an IN_DOUBT one waits for a person to resolve it, so those
are refused at any age.

The work is done in batches of ``batch_size`` workflows, each one statement and
so one short transaction (``delete_finished_workflows`` in ``queries.sql``): a
purge of millions of rows never holds locks, a snapshot or a huge WAL record
for long, and running workflows keep going while it runs. :class:`Retention`
repeats it in the background (``launch(retention=...)``, ``dbos-agent worker
--retention``); ``dbos-agent gc`` runs it once from the command line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta

from ..records import WorkflowStatus
from .runtime.current import current_engine
from .runtime.retention import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE
from .runtime.retention import DEFAULT_STATUSES as DEFAULT_STATUSES
from .runtime.retention import MAX_INTERVAL_S as MAX_INTERVAL_S
from .runtime.retention import GcReport as GcReport
from .runtime.retention import check_older_than as check_older_than
from .runtime.retention import check_statuses as check_statuses
from .runtime.retention import collect_garbage as collect_garbage
from .runtime.retention import retention_interval as retention_interval


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
    return collect_garbage(
        current_engine().db,
        older_than,
        statuses=statuses,
        batch_size=batch_size,
        dry_run=dry_run,
        progress=progress,
    )
