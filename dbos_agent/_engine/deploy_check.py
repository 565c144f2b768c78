"""Checking new code against the logs of the workflows in flight, before a deploy.

``dbos-agent check-deploy --app MODULE`` (in a child process of its own, see
:mod:`dbos_agent.cli.deploy_child`) and :func:`dbos_agent.testing.check_replay` (in the
caller's) import the new code and replay every unfinished workflow of the names it registers
(PENDING, SUSPENDED, DIVERGED, and ENQUEUED ones that have a log) against it, the way a
process of that code would after the deploy, but **without running anything live**:

* the replay engine (``Engine(replay_only=True)``) never opens a session, and its
  connections are read-only in Postgres itself;
* a recorded position replays its result; the first position past the log, an intent
  without a result, a wait that would block, or a workflow call not recorded yet is
  where the live run would do something new: the replay stops there (``PAST_LOG``) and
  the workflow *fits*;
* a position where the code calls another step than the log recorded is a divergence:
  the verdict names the workflow, the position, the recorded and the called names.

So no step, send, stream write or model call happens, whatever the code does at the
frontier. Recorded inputs the function no longer accepts, and code that raises before
its log ends, are reported too: both would fail the workflow after the deploy.

``--adopt`` then records, per fitting workflow of another application version, that
processes of the new version may run it (one guarded statement per workflow, refused if
its log moved since it was checked), so that a deploy can retire the old processes
without stranding anything.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .._storage.database import SystemDatabase
from .._storage.histories import History
from ..errors import DbosAgentError, WorkflowDivergedError, WorkflowInputsError
from ..records import Divergence, WorkflowStatus
from .runtime.collaborators import EngineOptions
from .runtime.context import PastLog, StopReason, WorkflowContext, entered_workflow
from .runtime.core import Engine
from .runtime.current import standing_in
from .runtime.executors import WorkerPool
from .runtime.outcome import Outcome, capture, capture_async
from .runtime.registry import WorkflowDefinition, code_version, find_workflow, workflow_names

#: Workflows read and replayed per page.
PAGE_SIZE = 500
#: Seconds one replay may take before it is reported as stuck (code that blocks on
#: something other than the durable API: a lock, input(), a network call in the body).
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """How one workflow's log fits the new code."""

    workflow_id: str
    name: str
    app_version: str | None
    status: WorkflowStatus
    #: Positions replayed before the replay stopped.
    replayed: int
    #: Where the code parted from the log (None: it did not).
    divergence: Divergence | None = None
    #: Why the workflow would fail under the new code other than by diverging (its
    #: inputs no longer fit, the code raises before its log ends, the replay hung).
    problem: str | None = None
    #: The log as checked (its number of steps and last position), for ``--adopt``.
    steps: int = 0
    last_seq: int = -1

    @property
    def fits(self) -> bool:
        """Whether a process of the new code would continue it from its log."""
        return self.divergence is None and self.problem is None


@dataclass(frozen=True, slots=True)
class Group:
    """The verdicts of one workflow name and application version."""

    name: str
    app_version: str | None
    fit: int
    misfits: list[Verdict]


@dataclass
class DeployCheck:
    """What a check found: a verdict per workflow, and what the new code is."""

    code_version: str
    app_version: str | None
    verdicts: list[Verdict] = field(default_factory=list)
    #: Workflows of other versions that the new version may now run (``--adopt``).
    adopted: int = 0
    #: Workflows whose log moved between the check and the adoption (not adopted).
    moved: int = 0

    @property
    def fits(self) -> bool:
        """Whether every checked workflow fits the new code."""
        return all(verdict.fits for verdict in self.verdicts)

    def groups(self) -> list[Group]:
        """Verdicts by workflow name and application version, in order."""
        keys = sorted(
            {(v.name, v.app_version) for v in self.verdicts},
            key=lambda k: (k[0], k[1] or ""),
        )
        fit = Counter((v.name, v.app_version) for v in self.verdicts if v.fits)
        return [
            Group(
                name,
                version,
                fit[(name, version)],
                [
                    v
                    for v in self.verdicts
                    if (v.name, v.app_version) == (name, version) and not v.fits
                ],
            )
            for name, version in keys
        ]


class ReplayChecker:
    """Replays histories against the workflows registered in this process, on a replay
    engine over read-only connections: nothing runs live, nothing is written."""

    def __init__(
        self, db: SystemDatabase, *, app_version: str | None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        if not db.read_only:
            raise ValueError("a replay check needs a read-only database (read_only=True)")
        self.engine = Engine(
            db,
            EngineOptions(executor_id="check-deploy", app_version=app_version),
            replay_only=True,
        )
        self.timeout = timeout
        self.code_version = code_version()
        self._sync: WorkerPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def check(self, history: History) -> Verdict:
        """Replay one workflow's log against its registered function."""
        definition = find_workflow(history.name)
        if definition is None:
            return self._verdict(history, 0, problem="no workflow of this name is registered")
        try:
            args, kwargs = definition.inputs.loads(history.inputs, history.workflow_id)
        except WorkflowInputsError as exc:
            return self._verdict(history, 0, problem=f"its recorded inputs no longer fit: {exc}")
        ctx = WorkflowContext(history.workflow_id, self.engine, dict(history.steps))
        try:
            outcome = self._replay(ctx, definition, args, kwargs)
        except TimeoutError:
            return self._verdict(
                history,
                ctx.positions_taken(),
                problem=f"the replay did not end within {self.timeout:g}s (the code blocks "
                "on something other than a durable wait)",
            )
        return self._judge(history, ctx, outcome)

    def _replay(
        self,
        ctx: WorkflowContext,
        definition: WorkflowDefinition,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Outcome:
        """Run the body in replay: a sync one on a thread of its own (a hung replay is
        left behind), an async one on the checker's event loop; within the timeout."""
        if definition.is_async:

            async def body() -> Outcome:
                try:
                    with entered_workflow(ctx), standing_in(self.engine):
                        return await capture_async(definition.fn(*args, **kwargs))
                except BaseException as exc:  # PastLog and other stops end the body
                    return Outcome(error=exc)

            future = asyncio.run_coroutine_threadsafe(body(), self._event_loop())
            try:
                return future.result(self.timeout)
            except TimeoutError:
                future.cancel()
                raise

        done: Future[Outcome] = Future()

        def run() -> None:
            try:
                with entered_workflow(ctx), standing_in(self.engine):
                    done.set_result(capture(definition.fn, *args, **kwargs))
            except BaseException as exc:  # PastLog and other stops end the body
                done.set_result(Outcome(error=exc))

        pool = self._sync or WorkerPool(1)
        self._sync = pool
        pool.submit(run)
        try:
            return done.result(self.timeout)
        except TimeoutError:
            self._sync = None  # its thread is stuck in that body: the next replay gets another
            raise

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="dbos-agent-check", daemon=True).start()
            self._loop = loop
        return self._loop

    def _judge(self, history: History, ctx: WorkflowContext, outcome: Outcome) -> Verdict:
        replayed = ctx.positions_taken()
        reason, error = ctx.stop_reason, ctx.stop_error
        if reason is StopReason.DIVERGED and isinstance(error, WorkflowDivergedError):
            return self._verdict(
                history,
                error.seq,
                divergence=Divergence(
                    error.seq, error.recorded, error.current, self.engine.app_version,
                    self.code_version,
                ),
            )  # fmt: skip
        if reason is StopReason.PAST_LOG:  # where the live run would do something new
            return self._verdict(history, error.seq if isinstance(error, PastLog) else replayed)
        if reason is None and outcome.error is None:  # the body returned
            return self._verdict(history, replayed)
        failure = error if reason is not None else outcome.error
        left = sorted(seq for seq in ctx.recorded if seq >= replayed)
        if isinstance(failure, DbosAgentError) or left:
            where = f" before its log ends (position {replayed} of {history.last_seq + 1})"
            return self._verdict(
                history,
                replayed,
                problem=f"the code raises {type(failure).__name__}"
                f"{where if left else ''}: {failure}",
            )
        return self._verdict(history, replayed)  # it raises what its log recorded

    def _verdict(
        self,
        history: History,
        replayed: int,
        *,
        divergence: Divergence | None = None,
        problem: str | None = None,
    ) -> Verdict:
        return Verdict(
            history.workflow_id,
            history.name,
            history.app_version,
            history.status,
            replayed,
            divergence,
            problem,
            len(history.steps),
            history.last_seq,
        )

    def close(self) -> None:
        """Stop the checker's threads (a replay stuck in user code is left behind)."""
        if self._sync is not None:
            self._sync.stop()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)


def verdict_document(verdict: Verdict) -> dict[str, Any]:
    """A verdict as JSON data (how ``check-deploy``'s child process reports it)."""
    found = verdict.divergence
    return {
        "workflow_id": verdict.workflow_id,
        "name": verdict.name,
        "app_version": verdict.app_version,
        "status": str(verdict.status),
        "replayed": verdict.replayed,
        "divergence": None
        if found is None
        else [found.position, found.recorded, found.called, found.app_version,
              found.code_version],
        "problem": verdict.problem,
        "steps": verdict.steps,
        "last_seq": verdict.last_seq,
    }  # fmt: skip


def verdict_from_document(doc: dict[str, Any]) -> Verdict:
    """The verdict :func:`verdict_document` describes."""
    found = doc["divergence"]
    return Verdict(
        doc["workflow_id"],
        doc["name"],
        doc["app_version"],
        WorkflowStatus(doc["status"]),
        doc["replayed"],
        None if found is None else Divergence(*found),
        doc["problem"],
        doc["steps"],
        doc["last_seq"],
    )


def stored_histories(
    db: SystemDatabase, names: list[str] | None = None, page: int = PAGE_SIZE
) -> Iterator[History]:
    """The unfinished workflows of ``names`` (default: every registered workflow) with
    their logs, page by page (memory stays flat however many there are)."""
    wanted = sorted(names if names is not None else workflow_names())
    after: tuple[datetime, str] | None = None
    while True:
        batch = db.histories.to_check(wanted, after, page)
        yield from batch
        if len(batch) < page:
            return
        last = batch[-1]
        assert last.created_at is not None
        after = (last.created_at, last.workflow_id)


def check(
    histories: Iterable[History],
    db: SystemDatabase,
    *,
    app_version: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[int], None] | None = None,
) -> DeployCheck:
    """Replay every history against the registered code (``db`` read-only: what the
    replays read of other workflows, children, and the clock)."""
    checker = ReplayChecker(db, app_version=app_version, timeout=timeout)
    report = DeployCheck(checker.code_version, app_version)
    try:
        for history in histories:
            report.verdicts.append(checker.check(history))
            if progress is not None:
                progress(len(report.verdicts))
    finally:
        checker.close()
    return report


def adopt(db: SystemDatabase, report: DeployCheck, version: str) -> None:
    """Record, for every fitting workflow of another application version, that processes
    of ``version`` may run it: one guarded statement each, refused when its log moved
    since the check (counted in ``report.moved``; check again)."""
    for verdict in report.verdicts:
        if not verdict.fits or verdict.app_version == version:
            continue
        if db.histories.adopt_version(
            verdict.workflow_id, version, steps=verdict.steps, last_seq=verdict.last_seq
        ):
            report.adopted += 1
        else:
            report.moved += 1
