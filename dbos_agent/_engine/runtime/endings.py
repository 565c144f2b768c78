"""How a run of this process ends: its outcome recorded (guarded: a run finished
elsewhere wins), or stopped without one for one of the reasons of ``StopReason``
(cancelled, suspended, no longer ours, the database gone, its code diverged from its
log), and in every case released from the run table with its future set.

The engine (``core.py``) owns one :class:`Endings` and hands it each run it executed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from ..._errors_codec import dumps_error
from ..._storage.database import SystemDatabase
from ...errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    SerializationError,
    WorkflowCancelledError,
    WorkflowDivergedError,
    WorkflowInterruptedError,
)
from ...records import WorkflowStatus
from .context import OwnershipLost, StopReason, WorkflowContext
from .executors import Wanted
from .outcome import Outcome, stored_outcome, workflow_outcome
from .registry import code_version
from .runs import RunTable, WorkflowRun
from .suspension import Suspended

log = logging.getLogger(__name__)


class Endings:
    """Ends the runs of one engine (see the module's docstring)."""

    def __init__(
        self,
        db: SystemDatabase,
        runs: RunTable,
        *,
        app_version: str | None,
        owner_key: Callable[[], int | None],
        released: Callable[[], None],
        take_back: Wanted,
    ) -> None:
        self._db = db
        self._runs = runs
        self._app_version = app_version
        #: This process's session key (None before the engine is opened).
        self._owner_key = owner_key
        #: Called whenever a run leaves the run table (a queue's slot may have freed).
        self._released = released
        #: Woken when a run cut off by an outage is to be taken back.
        self._take_back = take_back

    def resolve(self, run: WorkflowRun, outcome: Outcome) -> None:
        """The run ends here with ``outcome``: out of the run table, its future set."""
        self._runs.release(run)
        self._released()
        if not run.future.done():
            run.future.set_result(outcome)

    def abandon(self, run: WorkflowRun, exc: BaseException) -> None:
        """This process stops running the workflow without an outcome; it stays PENDING."""
        self.resolve(
            run,
            Outcome(
                error=WorkflowInterruptedError(
                    f"workflow {run.workflow_id!r} was interrupted in this process "
                    f"({type(exc).__name__}: {exc}); it stays PENDING and will be recovered"
                )
            ),
        )

    def ended_early(self, run: WorkflowRun, exc: BaseException) -> Outcome:
        """A run that ended by an exception out of the workflow's code or its finish: a
        suspension or a lost workflow ends it quietly; anything else (shutdown, a crash)
        leaves the workflow PENDING and is raised again."""
        if isinstance(exc, Suspended):
            return self._stop_suspended(run)
        self.abandon(run, exc)
        if isinstance(exc, OwnershipLost):
            return Outcome(error=exc)
        raise exc

    def finish(self, run: WorkflowRun, ctx: WorkflowContext, outcome: Outcome) -> Outcome:
        """Record the workflow's outcome, or stop without one (see StopReason)."""
        if ctx.stop_reason is None and isinstance(outcome.error, DatabaseUnavailableError):
            ctx.halt(StopReason.DATABASE, outcome.error)
        reason, stop_error = ctx.stop_reason, ctx.stop_error
        try:
            if reason is StopReason.CANCELLED:
                return self._stop_cancelled(run)
            if reason is StopReason.SUSPENDED:
                return self._stop_suspended(run)
            if reason in (StopReason.NOT_OWNER, StopReason.DATABASE, StopReason.UNCONFIGURED):
                assert stop_error is not None
                return self._stop_unfinished(run, stop_error)
            if reason is StopReason.DIVERGED:
                assert isinstance(stop_error, WorkflowDivergedError)
                return self._stop_diverged(run, stop_error)
            status = WorkflowStatus.SUCCESS
            if reason is StopReason.IN_DOUBT:  # even if user code swallowed the doubt
                outcome, status = Outcome(error=stop_error), WorkflowStatus.IN_DOUBT
            return self._record_outcome(run, outcome, status)
        except DatabaseUnavailableError as exc:
            return self._stop_unfinished(run, exc)

    def _record_outcome(
        self, run: WorkflowRun, outcome: Outcome, status: WorkflowStatus
    ) -> Outcome:
        """Write a finished run's outcome (guarded: a run finished elsewhere wins)."""
        where = f"workflow {run.workflow_id!r} ({run.definition.name}) result"
        while True:
            output = error = None
            if outcome.error is None:
                try:
                    output = run.definition.result.dumps(outcome.value, where)
                except SerializationError as exc:
                    outcome = Outcome(error=exc)
            if outcome.error is not None:
                error = dumps_error(outcome.error)
                if status is WorkflowStatus.SUCCESS:
                    status = WorkflowStatus.ERROR
            try:
                updated, stored_status, stored_output, stored_error = self._db.workflows.finish(
                    run.workflow_id, status, output, error, self._owner_key()
                )
                break
            except SerializationError as exc:  # too large, or refused: the user's error
                if outcome.error is not None:
                    raise
                outcome = Outcome(error=exc)
        if not updated and stored_status is WorkflowStatus.PENDING:
            # another session took the workflow over: its outcome is theirs to record
            return self._stop_unfinished(run, OwnershipLost(run.workflow_id))
        if not updated:
            outcome = stored_outcome(
                run.workflow_id, stored_status, stored_output, stored_error, run.definition.result
            )
        self.resolve(run, outcome)
        return outcome

    def _stop_unfinished(self, run: WorkflowRun, why: BaseException) -> Outcome:
        """This run ends without an outcome; the workflow stays PENDING. After a database
        failure this process takes it back once the database answers (unless retrying
        cannot help: then it waits for the next process)."""
        if isinstance(why, DatabaseUnavailableError) and why.retryable:
            self._take_back.set()
        elif isinstance(why, DatabaseUnavailableError | ConfigurationError):
            self._runs.park(run.workflow_id)
            log.error(
                "workflow %s stopped and stays PENDING until a process that can run it "
                "continues it (resume, recovery): %s",
                run.workflow_id,
                why,
            )
        self.abandon(run, why)
        return Outcome(error=why)

    def _stop_diverged(self, run: WorkflowRun, divergence: WorkflowDivergedError) -> Outcome:
        """The code called another step than the log recorded: a code change, never the
        workflow's error. It is held DIVERGED (unfinished, owned by nobody, saying where
        and how), left alone by processes of this code version and continued by one whose
        code fits its log. Its waiters keep waiting; a direct caller gets the divergence.
        """
        code = code_version()
        detail = {
            "position": divergence.seq,
            "recorded": divergence.recorded,
            "called": divergence.current,
            "app_version": self._app_version,
            "code_version": code,
            "at": datetime.now(UTC).isoformat(),
        }
        first_time = self._db.workflows.hold_diverged(
            run.workflow_id, self._owner_key(), code, json.dumps(detail)
        )
        if first_time is None:  # no longer ours: whoever owns it now decides
            return self._stop_unfinished(run, OwnershipLost(run.workflow_id))
        if first_time:
            log.warning(
                "workflow %s (%s) is held as DIVERGED: %s (code version %s%s). Processes of "
                "this code leave it alone; code that fits its log (an older version still "
                "running, or a fix using da.patched) continues it; or fork it from an "
                "earlier step, or cancel it.",
                run.workflow_id,
                run.definition.name,
                divergence.detail,
                code,
                "" if self._app_version is None else f", application version {self._app_version}",
            )
        self.resolve(
            run,
            Outcome(
                error=WorkflowInterruptedError(
                    f"workflow {run.workflow_id!r} is held as DIVERGED until code that fits "
                    "its log continues it"
                )
            ),
        )
        return Outcome(error=divergence)

    def _stop_suspended(self, run: WorkflowRun) -> Outcome:
        """The run gave its workflow up to wait (see suspension.py): it records nothing
        more, and whoever waits for the outcome waits on the database (a waker runs the
        workflow again, here or elsewhere, when its wait can be met)."""
        outcome = Outcome(
            error=WorkflowInterruptedError(
                f"workflow {run.workflow_id!r} is suspended: it waits without a thread and "
                "continues when woken"
            )
        )
        self.resolve(run, outcome)
        return outcome

    def _stop_cancelled(self, run: WorkflowRun) -> Outcome:
        """A run that saw its workflow cancelled records nothing: the cancel did.

        If an operator resumed the workflow meanwhile (PENDING again), the
        resumed run records the outcome; this one only stops.
        """
        info = self._db.workflows.get(run.workflow_id)
        if info is None or info.status is WorkflowStatus.PENDING:
            self.abandon(run, WorkflowCancelledError(f"workflow {run.workflow_id!r} was resumed"))
            return run.future.result()
        outcome = workflow_outcome(
            run.workflow_id, info.status, info.output, info.error, run.definition.result
        )
        self.resolve(run, outcome)
        return outcome
