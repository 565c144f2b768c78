"""Retries that outlast an outage: a step's failing dependency is waited out durably.

An attempt of a step fails. The step's policy (``registry.RetryPolicy``) says whether it
is tried again and after how long: within its ``retries``, or, for a *transient* error,
until its ``give_up_after`` horizon, counted from its first attempt on the database
clock. A wait of at most ``suspend_after`` seconds is a pause in the run. A longer one is
durable, and nothing is recorded as the step's outcome meanwhile:

* one guarded statement (``retry_step_later``) makes the step's row RETRYING: the
  attempts so far, the last error, when the first attempt started, when the next one is
  due and what it waits for (the model API, an MCP server), for operators to read;
* in a background run whose only live step is this one, the same statement gives the
  workflow up: SUSPENDED ``retry`` until the next attempt is due, holding no thread, no
  task and no session. Any process that can run it wakes it then (as a sleep); its
  replay comes back to this step, which goes on counting from the row;
* a run that cannot give its workflow up (a direct call, which its caller waits for; a
  step beside other running steps) waits in memory on the database clock.

``dbos-agent retry ID`` makes the next attempt due now (a NOTIFY ends an in-memory wait
and wakes a suspended workflow); a cancel ends the wait too. A RETRYING row is not an
intent: no attempt runs while the row says RETRYING. A non-idempotent step makes it its
intent again before it tries (``reopen_step_intent``), so that a crash during that
attempt leaves it in doubt as always; one cut off while waiting simply waits on.

So an outage of a dependency never becomes a workflow error: the error is recorded only
once it is not transient, or the horizon has passed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

from ..._errors_codec import dumps_error
from ..._storage.rows import StepRow, StepWrite
from ..._storage.steps import RetryLater, RetryWrite
from ..._storage.suspension import WaitCondition
from .clock import cancel_key, clock, stop_if_interrupted, wait_end
from .context import OwnershipLost, StopReason, WorkflowContext
from .notifications import RETRY_CHANNEL
from .plans import Io, Plan, Wait
from .registry import StepDefinition
from .suspension import Suspended

log = logging.getLogger(__name__)

#: A failed attempt's verdict: try again (True), record the error (False), or the log
#: refused the RETRYING row (what the position and the workflow hold instead).
Verdict = bool | StepWrite


@dataclass(eq=False)
class Retrying:
    """The attempts of one step run live: how many so far and since when.

    Made by :meth:`begin` from the step's row when a RETRYING row is where the run
    found the step (a run woken for its next attempt, a recovery), else fresh.
    """

    ctx: WorkflowContext
    step: StepDefinition
    seq: int
    #: When this run's first attempt started (recorded as the step's start unless an
    #: earlier run's RETRYING row started it earlier).
    started_at: datetime
    #: Attempts made so far, by this run and earlier ones.
    attempts: int = 0
    #: When the first attempt started, on the database clock (epoch seconds); None
    #: until a RETRYING row says it (then ``started`` stands in).
    since: float | None = None
    #: ``time.monotonic()`` when this run's first attempt started.
    started: float = 0.0
    #: The step's row says RETRYING now.
    recorded: bool = False

    @classmethod
    def begin(
        cls, ctx: WorkflowContext, step: StepDefinition, seq: int, row: StepRow | None
    ) -> Retrying:
        """The attempts of step ``seq`` from here, continuing those its RETRYING ``row``
        (if it is one) counted."""
        retrying = cls(ctx, step, seq, datetime.now(UTC), started=time.monotonic())
        state = None if row is None or row.retry is None else json.loads(row.retry)
        if isinstance(state, dict):
            retrying.attempts = row.attempts if row is not None else 0
            retrying.since = float(state["since"])
            retrying.recorded = True
        return retrying

    @property
    def reopens(self) -> bool:
        """Whether :meth:`before_attempt` has to write before the next attempt."""
        return self.recorded and not self.step.idempotent

    def before_attempt(self) -> Plan[None]:
        """Before the next attempt of a non-idempotent step that waited as RETRYING: make
        the row its intent again, so that a crash during the attempt is in doubt."""
        ctx = self.ctx
        reopened = yield Io(
            partial(
                ctx.engine.db.steps.reopen_intent,
                ctx.workflow_id,
                self.seq,
                self.step.name,
                ctx.engine.session_key,
            )
        )
        if not reopened:  # ownership was confirmed just before: the workflow moved on
            raise ctx.halt(StopReason.NOT_OWNER, OwnershipLost(ctx.workflow_id))
        self.recorded = False

    def after_failure(self, attempt: int, error: BaseException) -> Plan[Verdict]:
        """Attempt ``attempt`` failed with ``error``: wait until the next one is due and
        say True, or say False (record the error). Raises :class:`Suspended` (noted) when
        the workflow was given up to wait, and what ends a wait (a cancel, shutdown)."""
        self.attempts = attempt
        policy = self.step.retry
        delay = policy.delay_before_retry(attempt, error)
        if delay is None:
            if policy.give_up_after is None or not policy.transient(error):
                return False
            now: float = yield Io(self.ctx.engine.db.messages.database_time)
            left = self.first_attempt(now) + policy.give_up_after - now
            if left <= 0:
                return False
            delay = min(policy.backoff_delay(attempt, error), left)
        if delay <= self.ctx.engine.suspend_after and not self.recorded:
            yield Wait(None, delay)
            return True
        offset = self.ctx.engine.db.clock_offset  # the reading below is taken after it
        written: RetryWrite = yield Io(partial(self._write, error, delay))
        if not written.write.written:
            return written.write
        self.recorded, self.since = True, written.since
        self._log(error, written)
        if written.suspended:
            self.ctx.engine.note_suspended(written.next_at)
            condition = WaitCondition("retry", name=self.step.name, wake_at=written.next_at)
            raise self.ctx.halt(StopReason.SUSPENDED, Suspended(self.ctx.workflow_id, condition))
        yield from self._wait_in_memory(written.next_at - written.now, offset)
        return True

    def first_attempt(self, now: float) -> float:
        """When the first attempt started on the database clock: as recorded, or this
        run's own first attempt reckoned back from ``now``."""
        if self.since is not None:
            return self.since
        return now - (time.monotonic() - self.started)

    def _write(self, error: BaseException, delay: float) -> RetryWrite:
        ctx, step = self.ctx, self.step
        return ctx.engine.db.steps.retry_later(
            RetryLater(
                workflow_id=ctx.workflow_id,
                seq=self.seq,
                name=step.name,
                error=dumps_error(error),
                attempts=self.attempts,
                started_at=self.started_at,
                owner_key=ctx.engine.session_key,
                elapsed=time.monotonic() - self.started,
                delay=delay,
                waiting_for=step.retry.waits_for or step.name,
                suspend=ctx.may_suspend(own_step=True) and not ctx.engine.replay_only,
            )
        )

    def _wait_in_memory(self, seconds: float, offset: float) -> Plan[None]:
        """Wait ``seconds`` of database clock, less when an operator says retry now (a
        NOTIFY on the retry channel) or the run must stop (a cancel, shutdown)."""
        ctx = self.ctx
        notifications = ctx.engine.notifications
        end = wait_end(seconds, offset)
        now_please = threading.Event()

        def told(payload: str) -> None:
            if payload in (ctx.workflow_id, ""):
                now_please.set()

        unsubscribe = notifications.subscribe(RETRY_CHANNEL, told)
        try:
            with (
                ctx.waiting(),
                notifications.waiter(cancel_key(ctx), (RETRY_CHANNEL, ctx.workflow_id)) as waiter,
            ):
                stop_if_interrupted(ctx)
                while not now_please.is_set() and (left := end - clock(ctx.engine.db)) > 0:
                    yield Wait(waiter, min(left, notifications.recheck_interval()))
                    stop_if_interrupted(ctx)
        finally:
            unsubscribe()

    def _log(self, error: BaseException, written: RetryWrite) -> None:
        log.info(
            "workflow %s step %d (%s) waits for %s: attempt %d failed (%s: %s); next "
            "attempt in %.1fs%s",
            self.ctx.workflow_id,
            self.seq,
            self.step.name,
            self.step.retry.waits_for or self.step.name,
            self.attempts,
            type(error).__name__,
            error,
            written.next_at - written.now,
            " (suspended)" if written.suspended else "",
        )
