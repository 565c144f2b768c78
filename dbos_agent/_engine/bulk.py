"""Cancel, resume or delete many workflows: given ids, or a filter, in batches.

Each batch is one guarded statement over at most ``batch_size`` ids (``= ANY``), which
checks every workflow's status as the one-workflow action does and leaves the ones
whose status does not allow it: a bulk action never half-applies to a workflow, and
what it does to each is what ``cancel``, ``resume`` would do to it alone (a cancel
cancels the unfinished workflows it started; a resume hands it to whichever process
claims it). Delete deletes finished workflows (not PENDING, ENQUEUED, SUSPENDED,
DIVERGED, nor IN_DOUBT, which waits for a person: cancel those first) with their steps,
messages, events, streams and approvals, as retention does, and leaves the workflows
they started. A filter is read once, to the ids it matches then, and every batch
checks it again, so that a workflow that stopped matching meanwhile is left.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypedDict, Unpack

from .._limits import check_identifier
from .._storage.database import SystemDatabase
from ..errors import InvalidOptionError
from ..records import WorkflowFilter

#: Ids per statement: a batch locks at most this many workflows (and the ones they
#: started), for one short transaction.
DEFAULT_BULK_BATCH = 1000

Action = Literal["cancel", "resume", "delete"]


@dataclass(frozen=True, slots=True)
class BulkReport:
    """What a bulk action found and did (or, in a dry run, would do)."""

    action: Action
    #: The ids given (None: a filter chose them).
    requested: int | None
    #: The workflows that exist and match the filter.
    matched: int
    #: How many of them it cancelled, resumed or deleted (would, in a dry run).
    changed: int
    #: Cancel: the unfinished workflows they had started, cancelled with them.
    children: int
    #: Statements run: one per batch, and one that read a filter's ids.
    statements: int
    dry_run: bool

    @property
    def skipped(self) -> int:
        """Matched, but left: the status did not allow the action (already cancelled,
        finished, running...)."""
        return self.matched - self.changed


class BulkOptions(TypedDict, total=False):
    """How a bulk action chooses and goes (every bulk method of ``Client`` takes them)."""

    where: WorkflowFilter | None
    """Only workflows matching it; without ids, every workflow matching it."""
    all_workflows: bool
    """Without ids or ``where``: act on every workflow (refused unless this says so)."""
    dry_run: bool
    """Count what it would change; change nothing."""
    batch_size: int
    """Ids per statement (default :data:`DEFAULT_BULK_BATCH`)."""


def act_on_workflows(
    db: SystemDatabase,
    action: Action,
    workflow_ids: Iterable[str] | None = None,
    **options: Unpack[BulkOptions],
) -> BulkReport:
    """``action`` on the given ids that match ``where`` or, without ids, on every
    workflow ``where`` matches; with neither, only when ``all_workflows`` says so
    (InvalidOptionError otherwise: every workflow is rarely meant). ``dry_run`` counts."""
    batch_size = options.get("batch_size", DEFAULT_BULK_BATCH)
    if batch_size < 1:
        raise InvalidOptionError(f"batch_size must be at least 1, got {batch_size}")
    selection = options.get("where") or WorkflowFilter()
    statements = 0
    if workflow_ids is not None:
        ids = list(dict.fromkeys(check_identifier(i, "workflow id") for i in workflow_ids))
        requested: int | None = len(ids)
    elif selection.empty and not options.get("all_workflows", False):
        raise InvalidOptionError(
            f"refusing to {action} every workflow: give ids, a filter, or all_workflows=True"
        )
    else:
        ids, requested, statements = db.operations.ids(selection), None, 1
    dry_run = options.get("dry_run", False)
    matched = changed = children = 0
    for start in range(0, len(ids), batch_size):
        batch = ids[start : start + batch_size]
        if dry_run:
            found = db.operations.act_on_batch("count", batch, selection, counted=action)
        else:
            found = db.operations.act_on_batch(action, batch, selection)
        statements += 1
        matched += found.matched
        changed += found.changed
        children += found.children
    return BulkReport(action, requested, matched, changed, children, statements, dry_run)
