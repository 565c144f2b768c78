"""What an operator does to workflows, approvals and schedules from inside a launched
process: the forms that go through this process's runtime (a resumed or forked workflow
whose function this process has runs here at once, with a typed handle).

From any other process (a script, a web handler, the CLI's path) the same actions are
methods of :class:`dbos_agent.Client`, which needs only a database URL. None of these is a
workflow's own call: they stay out of the top level, which lists what a workflow body and
a program's start-up write.
"""

from __future__ import annotations

from ._engine.approvals import (
    ApprovalRequest,
    approval_digest,
    approve,
    list_approvals,
    reject,
)
from ._engine.bulk import BulkReport
from ._engine.operations import cancel, fork, resolve_in_doubt, resume, rewind
from ._engine.retention import GcReport, garbage_collect
from ._engine.schedules import (
    BackfillReport,
    backfill_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
)
from ._engine.workflow import list_steps, list_workflows

__all__ = [
    "ApprovalRequest",
    "BackfillReport",
    "BulkReport",
    "GcReport",
    "approval_digest",
    "approve",
    "backfill_schedule",
    "cancel",
    "fork",
    "garbage_collect",
    "list_approvals",
    "list_schedules",
    "list_steps",
    "list_workflows",
    "pause_schedule",
    "reject",
    "resolve_in_doubt",
    "resume",
    "resume_schedule",
    "rewind",
]
