"""``@step``: run a function once per workflow position, checkpointing its outcome.

Live, a step runs (with retries) and its outcome is committed to the step log
before the call returns to the workflow. On replay it returns the recorded
outcome without running. Outside a workflow, or inside another step, it is a
plain function call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from .._storage.rows import StepRow
from ..errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    NotInStepError,
    StepInDoubtError,
)
from ..records import StepStatus
from .runtime import tracing
from .runtime.checkpoints import adopt_recorded, checkpoint, where
from .runtime.context import (
    RunningStep as RunningStep,
)
from .runtime.context import (
    StopReason,
    WorkflowContext,
    current_attempt,
    current_context,
    entered_attempt,
    entered_step,
    in_step,
)
from .runtime.context import (
    step_key as step_key,
)
from .runtime.outcome import Outcome, capture, capture_async, step_outcome
from .runtime.ownership import ensure_owned, owns_now
from .runtime.plans import run_plan, run_plan_async
from .runtime.registry import NotDone as NotDone
from .runtime.registry import RetryPolicy as RetryPolicy
from .runtime.registry import StepDefinition
from .runtime.retries import Retrying
from .step_options import StepOptions, StepSettings

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger(__name__)


def _resolve_in_doubt(
    ctx: WorkflowContext,
    step: StepDefinition,
    seq: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Outcome | None:
    """An intent without a result: the guard decides, or the workflow stops IN_DOUBT."""
    if step.guard is None:
        raise ctx.halt(StopReason.IN_DOUBT, StepInDoubtError(ctx.workflow_id, seq, step.name))
    ensure_owned(ctx)
    started_at = datetime.now(UTC)
    with entered_step(seq):
        earlier = step.guard(*args, **kwargs)
    if earlier is NotDone:
        return None
    return checkpoint(ctx, step, seq, Outcome(value=earlier), 1, started_at)


def _position(
    ctx: WorkflowContext, step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[int, Outcome | None, StepRow | None]:
    """Take the step's position and resolve it without running the step if possible.

    Returns the recorded (or guarded) outcome, or None when the step must run
    live; for a non-idempotent step the intent is durable by then. A step that waited
    for its next attempt comes with its RETRYING row (its attempts go on from it).
    """
    seq, row = ctx.begin_step(step.name)
    if row is not None and row.status.finished:
        return (
            seq,
            step_outcome(row.status, row.output, row.error, step.result, where(ctx, seq, step)),
            None,
        )
    if row is not None and row.status is StepStatus.RETRYING:
        return seq, None, row
    if row is not None:
        return seq, _resolve_in_doubt(ctx, step, seq, args, kwargs), None
    if step.inputs is None:  # idempotent: nothing to write before running
        return seq, None, None
    inputs = step.inputs.dumps(args, kwargs)
    with ctx.noting_database_failures():
        write = ctx.engine.db.steps.record_intent(
            workflow_id=ctx.workflow_id,
            seq=seq,
            name=step.name,
            inputs=inputs,
            owner_key=ctx.engine.session_key,
        )
    return seq, None if write.written else adopt_recorded(ctx, step, seq, write), None


def _not_an_outage(ctx: WorkflowContext, outcome: Outcome) -> Outcome:
    """A step that failed because the database did (a library call inside it), or because
    this process lacks configuration, records nothing: the run stops unfinished, as when
    its own checkpoint fails, and the workflow stays PENDING."""
    if isinstance(outcome.error, DatabaseUnavailableError):
        raise ctx.halt(StopReason.DATABASE, outcome.error)
    if isinstance(outcome.error, ConfigurationError):
        raise ctx.halt(StopReason.UNCONFIGURED, outcome.error)
    return outcome


#: Sync steps already warned about blocking an event loop (one warning per step name).
_warned_blocking: set[str] = set()


def _warn_if_blocking(ctx: WorkflowContext, step: StepDefinition) -> None:
    """A sync step called on an async run's event loop holds that loop (every async run
    of the process) for its whole run and its checkpoint: say so, once per step."""
    if ctx.loop_thread == threading.get_ident() and step.name not in _warned_blocking:
        _warned_blocking.add(step.name)
        log.warning(
            "sync step %r was called in async workflow %r: it blocks the event loop every "
            "async workflow of this process shares while it runs; make it `async def`, or "
            "call it as `await asyncio.to_thread(%s, ...)`",
            step.name,
            ctx.workflow_id,
            step.name,
        )


def run_sync(step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call of a sync step: through the log in a workflow, a plain call elsewhere."""
    ctx = current_context()
    if ctx is None or in_step():
        return step.fn(*args, **kwargs)
    _warn_if_blocking(ctx, step)
    with ctx.running_step():
        return _run_sync_in(ctx, step, args, kwargs)


def _run_sync_in(
    ctx: WorkflowContext, step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    seq, known, row = _position(ctx, step, args, kwargs)
    if known is not None:
        tracing.step_replayed(seq, step.name)
        return known.unwrap()
    with tracing.span(_step_span, seq, step) as current:
        return _traced(current, *_attempts_sync(ctx, step, seq, args, kwargs, row))


def _traced(current: tracing.Span | None, outcome: Outcome, attempts: int) -> Any:
    """A live step's result, its attempts and failure noted on its span."""
    tracing.set_attributes(current, {"dbos_agent.step.attempts": attempts})
    tracing.failed(current, outcome.error)
    return outcome.unwrap()


def _step_span(seq: int, step: StepDefinition) -> tuple[str, dict[str, Any]]:
    return f"step {step.name}", {"dbos_agent.step.seq": seq, "dbos_agent.step.name": step.name}


def _attempts_sync(
    ctx: WorkflowContext,
    step: StepDefinition,
    seq: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    row: StepRow | None,
) -> tuple[Outcome, int]:
    """Run a step live (with retries, see runtime/retries.py) and checkpoint it; its
    outcome and attempts."""
    retrying = Retrying.begin(ctx, step, seq, row)
    with entered_step(seq):
        while True:
            ensure_owned(ctx)
            if retrying.reopens:
                run_plan(retrying.before_attempt())
            attempt = retrying.attempts + 1
            with entered_attempt(seq, attempt, step.name, step.retry.max_attempts) as current:
                outcome = capture(step.fn, *args, **kwargs)
            if outcome.error is None:
                break
            if current.wrote:
                current.void()
            # a sync step may run on an async run's loop (warned): its waits block it
            verdict = run_plan(retrying.after_failure(attempt, outcome.error), blocking=True)
            if verdict is False:
                break
            if verdict is not True:  # the log holds something else at this position
                return adopt_recorded(ctx, step, seq, verdict), attempt
    outcome = _not_an_outage(ctx, outcome)
    fresh = step.idempotent and not retrying.recorded
    done = checkpoint(
        ctx,
        step,
        seq,
        outcome,
        attempt,
        retrying.started_at,
        fresh=fresh,
        effects=current.effects,
    )
    return done, attempt


async def run_async(step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """:func:`run_sync` for an async step."""
    ctx = current_context()
    if ctx is None or in_step():
        return await step.fn(*args, **kwargs)
    with ctx.running_step():
        return await _run_async_in(ctx, step, args, kwargs)


async def _run_async_in(
    ctx: WorkflowContext, step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if step.idempotent:  # no I/O before a live run: stay on the loop
        seq, known, row = _position(ctx, step, args, kwargs)
    else:
        seq, known, row = await asyncio.to_thread(_position, ctx, step, args, kwargs)
    if known is not None:
        tracing.step_replayed(seq, step.name)
        return known.unwrap()
    with tracing.span(_step_span, seq, step) as current:
        return _traced(current, *await _attempts_async(ctx, step, seq, args, kwargs, row))


async def _attempts_async(
    ctx: WorkflowContext,
    step: StepDefinition,
    seq: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    row: StepRow | None,
) -> tuple[Outcome, int]:
    """:func:`_attempts_sync` on the event loop."""
    retrying = Retrying.begin(ctx, step, seq, row)
    with entered_step(seq):
        while True:
            if not owns_now(ctx):
                await asyncio.to_thread(ensure_owned, ctx)
            if retrying.reopens:
                await run_plan_async(retrying.before_attempt())
            attempt = retrying.attempts + 1
            with entered_attempt(seq, attempt, step.name, step.retry.max_attempts) as current:
                outcome = await capture_async(_attempt_async(step, args, kwargs))
            if outcome.error is None:
                break
            if current.wrote:
                await asyncio.to_thread(current.void)
            verdict = await run_plan_async(retrying.after_failure(attempt, outcome.error))
            if verdict is False:
                break
            if verdict is not True:  # the log holds something else at this position
                return adopt_recorded(ctx, step, seq, verdict), attempt
    outcome = _not_an_outage(ctx, outcome)
    fresh = step.idempotent and not retrying.recorded
    done = await asyncio.to_thread(
        partial(checkpoint, fresh=fresh, effects=current.effects),
        ctx,
        step,
        seq,
        outcome,
        attempt,
        retrying.started_at,
    )
    return done, attempt


async def _attempt_async(
    step: StepDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """One attempt of an async step, cancelled after the step's timeout (a TimeoutError,
    recorded and retried like any error)."""
    if step.timeout is None:
        return await step.fn(*args, **kwargs)
    attempt = asyncio.ensure_future(step.fn(*args, **kwargs))
    done, _ = await asyncio.wait({attempt}, timeout=step.timeout)
    if attempt in done:
        return attempt.result()
    # The timeout wins even over a body that swallows its cancellation and returns
    # later: what it returns then is dropped, never recorded. It is awaited, so that a
    # retry never runs beside it.
    attempt.cancel()
    await asyncio.gather(attempt, return_exceptions=True)
    raise TimeoutError(f"step {step.name!r} did not finish within {step.timeout}s")


def step_info() -> RunningStep:
    """The step running here: its workflow, position, name, attempt and most attempts.

    For a step that wants to know where it is (a log line, a key of its own, a last
    attempt that degrades instead of failing). Raises :class:`NotInStepError` outside a
    step run live by a workflow (a step called outside a workflow is a plain call).
    """
    ctx = current_context()
    attempt = current_attempt()
    if ctx is None or attempt is None or not in_step():
        raise NotInStepError(
            "da.step_info() is only available inside a @da.step running in a durable workflow"
        )
    return RunningStep(
        workflow_id=ctx.workflow_id,
        position=attempt.seq,
        name=attempt.name,
        attempt=attempt.number,
        max_attempts=attempt.max_attempts,
    )


def make_step(fn: Callable[P, R], definition: StepDefinition) -> Callable[P, R]:
    """Wrap ``fn`` so that calls inside a workflow go through the step log."""
    if definition.is_async:

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await run_async(definition, args, kwargs)

        wrapper: Any = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            return run_sync(definition, args, kwargs)

        wrapper = sync_wrapper
    wrapper.__dbos_agent_step__ = definition
    return wrapper  # type: ignore[no-any-return]


@overload
def step(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def step(
    *, name: str | None = None, **options: Unpack[StepOptions]
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def step(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    **options: Unpack[StepOptions],
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a function a durable step: its outcome is checkpointed, and replayed on recovery.

    ``retries=N`` allows N+1 attempts for exceptions in ``retry_on``, waiting
    ``interval * backoff**(attempt-1)`` seconds (at most ``max_interval``,
    randomised by +/- ``jitter``) between them; with ``retry_if`` (a predicate on
    the exception) only exceptions in ``retry_on`` for which it returns true are
    retried. When they run out, the last original exception is recorded and raised.
    :func:`step_info` tells the running step its position and attempt. Works bare (``@step``) or
    with arguments, on ``def`` and ``async def`` functions.

    Idempotent steps (the default) are at-least-once: a step cut off by a
    crash before its checkpoint runs again. With ``idempotent=False`` the
    intent is recorded before the step runs; if a crash leaves it without a
    result, the step is *in doubt*: ``guard(*args, **kwargs)`` (a sync
    check-then-act) returns the earlier result or :data:`NotDone` (run it);
    without a guard the workflow stops in ``IN_DOUBT`` for an operator.

    ``retry_policy`` replaces the retry arguments with a :class:`RetryPolicy`
    (or a subclass deciding delays itself, e.g. from an error's retry-after).

    ``timeout`` (async steps only) cancels an attempt that runs longer than that many
    seconds; the attempt fails with a TimeoutError, retried (by ``retry_on``) and
    recorded like any error.

    ``give_up_after`` (seconds or a ``timedelta``; ``math.inf`` for ever) makes the step
    outlast an outage of what it depends on: an error it retries (``retry_on`` and
    ``retry_if``, or a :class:`~dbos_agent.errors.DependencyUnavailableError`) is tried
    again past ``retries``, with the same capped backoff, until that long after the
    first attempt; only then is it recorded. Without it (the default) ``retries`` alone
    decides, as before. Either way a wait for the next attempt longer than
    ``launch(suspend_after=)`` is durable: the step's row says RETRYING (attempts, last
    error, next attempt), a background workflow is SUSPENDED meanwhile (no thread held,
    surviving kill -9 and take-over), and ``dbos-agent retry ID`` tries it now (see
    runtime/retries.py). ``waits_for`` names what it waits for meanwhile, as operators
    read it (``"the payments API"``; default: the step's name). ``retry_policy`` replaces
    every retry argument, these two too (given beside it, they are refused).

    The options are :class:`~dbos_agent._engine.step_options.StepOptions`, the same that
    ``@tool`` and an MCP server's tools take; an unknown one is a TypeError naming it.
    """
    settings = StepSettings.of(options, f"step {name!r}" if name else "step")

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        return make_step(func, settings.define(func, name))

    return decorate(fn) if fn is not None else decorate
