"""Recovery: continue, from their logs, PENDING workflows whose executor session is dead.

At launch, an executor takes back its own executor id's workflows whose session
is dead; the worker daemon also takes over orphans of any executor. When a
session counts as dead is written in migrations 006, 022 and 024: a lease run out,
a lock free past its grace (both counted from the later of the last heartbeat and
the moment the server began accepting writes: its start, or its promotion from
standby), or (seen from the same host) a pid that no longer runs, which makes a
restart after kill -9 take its workflows back at once.
Workflows are claimed a page at a time (each claim counts one recovery
attempt and dead-letters those over their limit, in one statement), their
logs are loaded with one query per page, and they run on the bounded worker
pool: memory stays flat however many are pending.

A take-over claims only what this process can start at once: no more sync workflows
than it has idle worker threads, no more async ones than free event-loop slots. The
rest stays claimable, so a peer with room takes it, and this process looks again as
soon as one of its runs ends (not a period later). Recovery at launch of this
executor's own workflows pages into the worker pool as before (see ``_in_pages``).

A process also takes back what is still its own but no longer runs: a run cut
off by an outage past its bound, a claim whose reply was lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from ..._storage.rows import RecoveryClaim, Runner
from ..._storage.session import end_dead_local_sessions
from ...errors import DatabaseUnavailableError, WorkflowInputsError
from ...records import RecoveryReport, WorkflowStatus
from .collaborators import BackgroundPass
from .core import Engine
from .notifications import CLAIMABLE_CHANNEL
from .registry import find_workflow, workflow_names, workflow_names_of
from .runs import Claim

log = logging.getLogger(__name__)

PAGE_SIZE = 200
_PROGRESS_EVERY_S = 5.0


def recover_pending(engine: Engine) -> RecoveryReport:
    """Recover this executor's recoverable PENDING workflows (run once at launch).

    Workflows of a session that lost its lock on another host are waited for
    during that session's grace (it may be alive and reconnecting), then taken.

    Unlike a take-over it is not bounded by the room the process has: the process is
    that executor again, and its report counts all it took. It claims a page at a time,
    the next once the worker pool's backlog has room, so it holds at most a page it has
    not started, and what it has not claimed yet stays claimable by peers meanwhile.
    """
    report = RecoveryReport()
    started = time.perf_counter()
    try:
        _warn_unknown(engine, report)
        give_up_at = time.monotonic() + 2 * engine.session.grace_seconds + 1
        while not engine.stopping:
            claim_and_recover(engine, orphans=False, report=report)
            assert engine.session_key is not None
            waiting = engine.db.recovery.count_claimable_soon(
                engine.executor_id, engine.session_key, workflow_names()
            )
            if not waiting or time.monotonic() > give_up_at:
                break
            time.sleep(0.2)
    except Exception as exc:
        if not engine.stopping:
            log.error("recovery of pending workflows failed: %s", exc)
    finally:
        report.seconds = time.perf_counter() - started
        engine.note_recovered(report)
    if report.recovered or report.dead_lettered or report.failed_inputs:
        log.info(
            "recovery: recovered %d workflow(s), dead-lettered %d, %d with unusable inputs (%.2fs)",
            report.recovered,
            report.dead_lettered,
            report.failed_inputs,
            report.seconds,
        )
    return report


def _warn_unknown(engine: Engine, report: RecoveryReport) -> None:
    names = workflow_names()
    for name, count in engine.db.recovery.count_unrecoverable(engine.executor_id, names).items():
        report.unknown += count
        log.warning(
            "%d PENDING workflow(s) named %r cannot be recovered: no workflow of that name is "
            "registered in this process (renamed, deleted, or its module not imported before "
            "launch()). They stay PENDING.",
            count,
            name,
        )


def claim_and_recover(
    engine: Engine, *, orphans: bool, report: RecoveryReport, looked_at_local: bool = False
) -> None:
    """Claim page after page of recoverable workflows and hand them to the worker pool,
    then the DIVERGED ones this code may fit.

    Sessions of this host whose process is gone are declared dead first, unless the
    caller just did (``looked_at_local``).
    """
    if not looked_at_local:
        end_dead_local_sessions(engine.db)
    runner = engine.runner()
    _recover_orphans(engine, runner, orphans=orphans, report=report)
    _continue_diverged(engine, runner, orphans=orphans, report=report)


def _recover_orphans(
    engine: Engine, runner: Runner, *, orphans: bool, report: RecoveryReport
) -> None:
    """The PENDING workflows of dead sessions (``orphans``: of any executor id, as far as
    this process has room, else this one's), page by page; each claim counts a recovery
    attempt."""
    db = engine.db
    assert engine.session_key is not None, "the runtime has no executor session"
    owner_key = engine.session_key
    after: dict[bool | None, tuple[datetime, str]] = {}
    last_progress = time.monotonic()

    def claim_page(kind: Runner, key: bool | None, limit: int) -> bool:
        nonlocal last_progress
        claims = db.recovery.claim(
            executor_id=engine.executor_id,
            owner_key=owner_key,
            runner=kind,
            skip_ids=engine.active_ids(),
            orphans=orphans,
            after=after.get(key),
            limit=limit,
        )
        if claims:
            after[key] = (claims[-1].created_at, claims[-1].workflow_id)
        _start_recovered(engine, claims, report)
        if time.monotonic() - last_progress > _PROGRESS_EVERY_S:
            last_progress = time.monotonic()
            log.info("recovery in progress: %d recovered so far", report.recovered)
        return bool(claims)  # a short page may have skipped rows another claimer locked

    _in_pages(engine, runner, claim_page, bounded=orphans)


def _start_recovered(engine: Engine, claims: list[RecoveryClaim], report: RecoveryReport) -> None:
    """Run the claimed workflows that are still PENDING; report the dead-lettered ones."""
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
    runnable = [
        Claim(definition, claim.workflow_id, claim.inputs)
        for claim in claims
        if claim.status is WorkflowStatus.PENDING
        and (definition := find_workflow(claim.name)) is not None
    ]
    for future in engine.start_claimed(runnable):
        if future is None:
            continue
        if future.done() and isinstance(future.result().error, WorkflowInputsError):
            report.failed_inputs += 1
        else:
            report.recovered += 1


def _continue_diverged(
    engine: Engine, runner: Runner, *, orphans: bool, report: RecoveryReport
) -> None:
    """Take the DIVERGED workflows whose log this code may fit (its code version did not
    diverge on them: an older version still running, a fixed deploy) and run them from
    their logs; one that diverges again is held again, with this version added."""
    assert engine.session_key is not None
    owner_key = engine.session_key

    def claim_page(kind: Runner, _key: bool | None, limit: int) -> bool:
        page = engine.db.recovery.claim_diverged(
            executor_id=engine.executor_id,
            owner_key=owner_key,
            runner=kind,
            orphans=orphans,
            limit=limit,
        )
        claims = [
            Claim(definition, workflow_id, inputs)
            for workflow_id, name, inputs in page
            if (definition := find_workflow(name)) is not None
        ]
        report.continued_diverged += sum(f is not None for f in engine.start_claimed(claims))
        return len(page) == limit

    _in_pages(engine, runner, claim_page, bounded=orphans)


def _in_pages(
    engine: Engine,
    runner: Runner,
    claim_page: Callable[[Runner, bool | None, int], bool],
    *,
    bounded: bool,
) -> None:
    """Call ``claim_page(runner, kind, limit)`` (it claims and starts up to ``limit``
    workflows of the runner's names, and says whether there may be more) while it says so
    and this session's fence holds.

    Unbounded (recovery at launch, of this executor's own workflows): pages of PAGE_SIZE
    into the worker pool, whose backlog bound makes the claiming wait for room (see
    ``recover_pending``). Bounded (a take-over, of any executor's): sync workflows (run by
    worker threads) and async ones (event-loop slots) apart, no page larger than the room
    of its kind now (``kind`` is ``is_async``). A kind out of room arms ``engine.room``
    and stops: what is left stays claimable by a peer with room, or by this process's
    next pass, which the next run to end here starts at once.
    """
    if not bounded:
        while _may_claim(engine) and claim_page(runner, None, PAGE_SIZE):
            pass
        return
    for is_async in (False, True):
        kind = replace(runner, names=workflow_names_of(is_async))
        while kind.names and _may_claim(engine):
            limit = min(PAGE_SIZE, engine.free_slots(is_async))
            if limit <= 0:
                engine.room.arm()  # then read again: a run that ended meanwhile counts
                if engine.free_slots(is_async) <= 0:
                    break
                continue
            if not claim_page(kind, is_async, limit):
                break


def _may_claim(engine: Engine) -> bool:
    """Not shutting down, and sure that this session is alive to others (else wait)."""
    return not engine.stopping and engine.ownership_mark() >= 0


def take_back_idle(engine: Engine) -> int:
    """Recover the PENDING workflows this session owns but no longer runs; how many.

    The list is only a hint: a workflow on it may be starting here right now (woken,
    claimed, dequeued, not yet registered) and will be run once, by whichever start
    registers first (see Engine.start_claimed).
    """
    assert engine.session_key is not None
    taken = 0
    while not engine.stopping:
        skip = engine.active_ids() + engine.parked_ids()
        idle = engine.db.recovery.owned_idle(engine.session_key, skip, PAGE_SIZE)
        claims = [
            Claim(definition, workflow_id, inputs)
            for workflow_id, name, inputs in idle
            if (definition := find_workflow(name)) is not None
        ]
        taken += sum(future is not None for future in engine.start_claimed(claims))
        if len(idle) < PAGE_SIZE:
            break
    if taken:
        log.info("took back %d workflow(s) this process owns but had stopped running", taken)
    return taken


class RecoverAtLaunch(BackgroundPass):
    """Recovery at launch (:func:`recover_pending`), once, on its own thread."""

    thread_name = "dbos-agent-recovery"
    recovers_at_launch = True

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def run(self) -> None:
        recover_pending(self._engine)


class TakeBack(BackgroundPass):
    """The take-back thread: after an outage (or now and then) recover what is ours."""

    thread_name = "dbos-agent-take-back"

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def run(self) -> None:
        engine = self._engine
        while not engine.stopping:
            woken, urgent = engine.take_back_wanted.take(engine.passes.take_back)
            if engine.stopping:
                return
            if woken and not urgent:
                time.sleep(0.2)  # let a burst of stopped runs settle first
            try:
                take_back_idle(engine)
            except DatabaseUnavailableError:
                engine.take_back_wanted.set()  # still down: try again after the next wait
                time.sleep(1.0)
            except Exception as exc:
                log.error("taking back this process's workflows failed: %s", exc)


def take_over_once(engine: Engine) -> RecoveryReport:
    """One take-over pass: take over the workflows of dead sessions that this process
    can run (a registered name, its application version), no more than it can start now
    (idle worker threads, free event-loop slots: see ``_in_pages``). While there are none
    it costs one statement (``probe_orphans``), which also declares dead the sessions of
    processes gone from this host."""
    report = RecoveryReport()
    assert engine.session_key is not None, "the runtime has no executor session"
    claimable, unlocked = engine.db.recovery.probe_orphans(
        owner_key=engine.session_key, runner=engine.runner()
    )
    ended = end_dead_local_sessions(engine.db, unlocked)
    if claimable or ended:
        claim_and_recover(engine, orphans=True, report=report, looked_at_local=True)
    if report.recovered or report.dead_lettered or report.continued_diverged:
        log.info(
            "took over %d orphaned workflow(s), dead-lettered %d, continued %d diverged",
            report.recovered,
            report.dead_lettered,
            report.continued_diverged,
        )
    return report


class TakeOver(BackgroundPass):
    """The take-over thread (a launched process has one unless its take-over is off, see
    ``LaunchOptions.take_over``): every ``engine.passes.take_over`` seconds, at once when
    a workflow becomes claimable (NOTIFY on dbos_agent_claimable: a resume without an
    owner, a session that ended leaving work, a workflow held DIVERGED), and at once when
    a run ends here after a pass stopped for want of room, take over the workflows of
    dead sessions and the diverged ones this code may fit, of any executor, as many as
    this process can start now; now and then forget long-dead executors."""

    thread_name = "dbos-agent-take-over"

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._wanted = threading.Event()
        engine.notifications.subscribe(CLAIMABLE_CHANNEL, lambda _: self._wanted.set())
        engine.room.on_freed(self._wanted.set)  # a pass out of room: a run here ended

    def wake(self) -> None:
        self._wanted.set()  # a moved clock (leases end), shutdown

    def run(self) -> None:
        engine, wanted = self._engine, self._wanted
        last_cleanup = time.monotonic()
        cleanup_every = max(engine.session.lease_seconds, 5.0)
        while not engine.recovery_done.wait(0.5):  # recovery at launch claims alone, and
            if engine.stopping:  # its report counts all it took
                return
        while not engine.stopping:
            try:
                take_over_once(engine)
                if time.monotonic() - last_cleanup > cleanup_every:
                    last_cleanup = time.monotonic()
                    engine.db.recovery.delete_dead_executors()
            except Exception as exc:
                if not engine.stopping:
                    log.warning("taking over orphaned workflows failed (retrying): %s", exc)
            wanted.wait(engine.passes.take_over)
            wanted.clear()
