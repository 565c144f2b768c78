"""What a recovery saved: steps replayed from the log instead of run, and what they cost once.

A tracker is attached to the running workflow (by :func:`track_replay` at the top of the
workflow, or by the first model or tool step). It snapshots the history the run started
with and notices the first step that has no recorded outcome: that is where replay ends and
live execution begins. The report is computed then, from the recorded model replies' usage,
and handed to the ``on_done`` callbacks. Nothing is written to the database.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from .._engine.extending import WorkflowContext, current_context
from .._storage.rows import StepRow
from ..records import StepStatus
from .accounting import (
    MODEL_STEP_NAMES,
    PriceTable,
    Usage,
    is_tool_call,
    is_tool_step,
    usage_of_reply,
)

__all__ = [
    "ReplayReport",
    "last_replay_report",
    "next_step_replays",
    "replay_report",
    "replaying",
    "track_replay",
]


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What replaying the log saved a recovered workflow.

    ``elapsed_s`` runs from the tracker's start (the top of the workflow body, with
    :func:`track_replay`) to the first live step: replaying, rebuilding the conversation,
    and first-use warm-up of the validators in a fresh process. Loading the log from the
    database happens before the body starts and is not included.
    """

    workflow_id: str
    steps_replayed: int
    model_calls_replayed: int
    tool_calls_replayed: int
    usage_saved: Usage
    elapsed_s: float
    steps: tuple[tuple[int, str], ...] = ()
    """``(position, step name)`` of every replayed step, in order."""

    @property
    def input_tokens_saved(self) -> int:
        """Input tokens of the replayed model calls: not paid again."""
        return self.usage_saved.input_tokens

    @property
    def output_tokens_saved(self) -> int:
        """Output tokens of the replayed model calls: not paid again."""
        return self.usage_saved.output_tokens

    def cost_saved(self, prices: PriceTable | None = None) -> float | None:
        """Dollar value of the replayed model calls, if every model has a price."""
        return self.usage_saved.cost(prices)

    def summary(self) -> str:
        """One human line, e.g. for a terminal after a recovery."""
        return (
            f"replayed {self.steps_replayed} steps from the log in {self.elapsed_s * 1000:.1f} ms: "
            f"{self.model_calls_replayed} model calls and {self.tool_calls_replayed} tool calls "
            f"not run again, {self.input_tokens_saved:,} input + "
            f"{self.output_tokens_saved:,} output tokens not re-paid"
        )


@dataclass(eq=False)
class _Tracker:
    workflow_id: str
    started: float
    history: list[StepRow]
    last_recorded: int | None
    callbacks: list[Callable[[ReplayReport], None]] = field(default_factory=list)
    report: ReplayReport | None = None
    finished: bool = False


_lock = threading.Lock()
_trackers: weakref.WeakKeyDictionary[WorkflowContext, _Tracker] = weakref.WeakKeyDictionary()
_last: dict[str, ReplayReport] = {}


def _tracker(ctx: WorkflowContext) -> _Tracker:
    with _lock:
        tracker = _trackers.get(ctx)
        if tracker is None:
            rows = sorted(ctx.recorded.items())
            history = [row for _, row in rows if row.status.finished]
            tracker = _Tracker(
                workflow_id=ctx.workflow_id,
                started=time.perf_counter(),
                history=history,
                last_recorded=history[-1].seq if history else None,
                finished=not history,
            )
            _trackers[ctx] = tracker
        return tracker


def _build(tracker: _Tracker, elapsed: float) -> ReplayReport:
    usage = Usage()
    model_calls = 0
    for row in tracker.history:
        if row.name in MODEL_STEP_NAMES and row.status is StepStatus.SUCCESS:
            model_calls += 1
            usage = usage + usage_of_reply(json.loads(row.output or "null"))
    return ReplayReport(
        workflow_id=tracker.workflow_id,
        steps_replayed=len(tracker.history),
        model_calls_replayed=model_calls,
        tool_calls_replayed=sum(
            1
            for r in tracker.history
            if is_tool_step(r.name) and is_tool_call(r.name, json.loads(r.output or "null"))
        ),
        usage_saved=usage,
        elapsed_s=elapsed,
        steps=tuple((row.seq, row.name) for row in tracker.history),
    )


def _finish(tracker: _Tracker) -> list[Callable[[ReplayReport], None]]:
    """Close the replay phase; returns the callbacks to run (outside the lock)."""
    with _lock:
        if tracker.finished:
            return []
        tracker.finished = True
        tracker.report = _build(tracker, time.perf_counter() - tracker.started)
        _last[tracker.workflow_id] = tracker.report
        return list(tracker.callbacks)


def _fire(tracker: _Tracker, callbacks: list[Callable[[ReplayReport], None]]) -> None:
    report = tracker.report
    if report is not None:
        for callback in callbacks:
            callback(report)


def track_replay(on_done: Callable[[ReplayReport], None] | None = None) -> None:
    """Start watching this workflow's replay; call first thing in the workflow body.

    ``on_done(report)`` runs once, when the first live step is about to start (or when
    :func:`replay_report` is called), and only if the run replayed something. Outside a
    workflow this does nothing.
    """
    ctx = current_context()
    if ctx is None:
        return
    tracker = _tracker(ctx)
    if on_done is not None:
        with _lock:
            tracker.callbacks.append(on_done)


def note_step() -> None:
    """Called before a step takes its position: ends the replay phase if the history is used up.

    Model and tool steps call it; call it yourself before other live work (e.g. waiting
    for a human) so that the replay report does not count that wait.
    """
    ctx = current_context()
    if ctx is None:
        return
    tracker = _tracker(ctx)
    if tracker.finished or tracker.last_recorded in ctx.recorded:
        return
    _fire(tracker, _finish(tracker))


def replaying() -> bool:
    """True while this run is still in its replay phase (no live step yet, history left).

    Use it to keep a recovered run quiet about what it merely replays, or to run a crash
    hook only in the run that really executed that point.
    """
    ctx = current_context()
    return ctx is not None and not _tracker(ctx).finished


def next_step_replays() -> bool:
    """True when the next step of this run has a recorded outcome (it will replay).

    E.g. say "waiting for approval" only when the wait is live: on the first run, and on
    a recovered run whose approval had not arrived yet, but not when the decision is in the log.
    """
    ctx = current_context()
    row = None if ctx is None else ctx.next_recorded()
    return row is not None and row.status.finished


def replay_report() -> ReplayReport | None:
    """This run's report (closing the replay phase now if still open); None if fresh."""
    ctx = current_context()
    if ctx is None:
        return None
    tracker = _tracker(ctx)
    _fire(tracker, _finish(tracker))
    return tracker.report


def last_replay_report(workflow_id: str) -> ReplayReport | None:
    """The report of the latest recovered run of ``workflow_id`` in this process, if any."""
    with _lock:
        return _last.get(workflow_id)
