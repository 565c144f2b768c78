"""Recovery: resume PENDING workflows whose executor session is gone.

At launch, an executor takes back its own workflows whose session is not
alive (a restart after kill -9 does not wait for a lease); the worker daemon
also takes over orphans of other executors once their lease has expired.
Workflows are claimed a page at a time (each claim counts one recovery
attempt and dead-letters those over their limit, in one statement), their
logs are loaded with one query per page, and they run on the bounded worker
pool: memory stays flat however many are pending.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..errors import WorkflowInputsError
from ..records import WorkflowStatus
from ..serialization import dumps_error
from ..storage.database import StepRow
from .registry import WorkflowDefinition, find_workflow, workflow_names
from .runtime import Runtime

log = logging.getLogger("dbos_agent.recovery")

PAGE_SIZE = 200
_PROGRESS_EVERY_S = 5.0


@dataclass
class RecoveryReport:
    """What one recovery pass did."""

    resumed: int = 0
    dead_lettered: int = 0
    failed_inputs: int = 0
    unknown: int = 0
    seconds: float = 0.0


def recover_pending(runtime: Runtime) -> RecoveryReport:
    """Resume this executor's recoverable PENDING workflows (run once at launch)."""
    report = RecoveryReport()
    started = time.perf_counter()
    try:
        _warn_unknown(runtime, report)
        claim_and_resume(runtime, orphans=False, report=report)
    except Exception:
        if not runtime.stopping:
            log.exception("recovery of pending workflows failed")
    finally:
        report.seconds = time.perf_counter() - started
        runtime.last_recovery = report
        runtime.recovery_done.set()
    if report.resumed or report.dead_lettered or report.failed_inputs:
        log.info(
            "recovery: resumed %d workflow(s), dead-lettered %d, %d with unusable inputs (%.2fs)",
            report.resumed,
            report.dead_lettered,
            report.failed_inputs,
            report.seconds,
        )
    return report


def _warn_unknown(runtime: Runtime, report: RecoveryReport) -> None:
    names = workflow_names()
    for name, count in runtime.db.count_unrecoverable_pending(runtime.executor_id, names).items():
        report.unknown += count
        log.warning(
            "%d PENDING workflow(s) named %r cannot be recovered: no workflow of that name is "
            "registered in this process (renamed, deleted, or its module not imported before "
            "launch()). They stay PENDING.",
            count,
            name,
        )


def run_claimed(
    runtime: Runtime,
    definition: WorkflowDefinition,
    workflow_id: str,
    inputs: str,
    recorded: dict[int, StepRow],
) -> bool:
    """Run a workflow this session just claimed; False (and ERROR recorded) when its
    recorded inputs no longer fit the function: its siblings go on regardless."""
    try:
        runtime.resume(definition, workflow_id, inputs, recorded)
    except WorkflowInputsError as exc:
        log.error("cannot run workflow %s: %s", workflow_id, exc)
        runtime.db.finish_workflow(
            workflow_id, WorkflowStatus.ERROR, None, dumps_error(exc), runtime.session_key
        )
        return False
    return True


def claim_and_resume(runtime: Runtime, *, orphans: bool, report: RecoveryReport) -> None:
    """Claim page after page of recoverable workflows and hand them to the worker pool."""
    db = runtime.db
    assert runtime.session_key is not None, "the runtime has no executor session"
    names = workflow_names()
    after = None
    last_progress = time.monotonic()
    while not runtime.stopping:
        claims = db.claim_workflows(
            executor_id=runtime.executor_id,
            owner_key=runtime.session_key,
            app_version=runtime.app_version,
            names=names,
            skip_ids=runtime.active_ids(),
            orphans=orphans,
            after=after,
            limit=PAGE_SIZE,
        )
        if not claims:
            return
        after = (claims[-1].created_at, claims[-1].workflow_id)
        live = [c for c in claims if c.status is WorkflowStatus.PENDING]
        for claim in claims:
            if claim.status is WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED:
                report.dead_lettered += 1
                log.error(
                    "workflow %s (%s) exceeded its %d recovery attempts and was moved to "
                    "MAX_RECOVERY_ATTEMPTS_EXCEEDED; it will not run again by itself",
                    claim.workflow_id,
                    claim.name,
                    claim.max_recovery_attempts,
                )
        logs = db.load_steps_of_many([c.workflow_id for c in live])
        for claim in live:
            definition = find_workflow(claim.name)
            if definition is None:  # unregistered between the claim and now
                continue
            if run_claimed(
                runtime, definition, claim.workflow_id, claim.inputs, logs[claim.workflow_id]
            ):
                report.resumed += 1
            else:
                report.failed_inputs += 1
        if time.monotonic() - last_progress > _PROGRESS_EVERY_S:
            last_progress = time.monotonic()
            log.info("recovery in progress: %d resumed so far", report.resumed)
