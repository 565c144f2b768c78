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

A process also takes back what is still its own but no longer runs: a run cut
off by an outage past its bound, a claim whose reply was lost.
"""

from __future__ import annotations

import logging
import threading
import time

from ...errors import DatabaseUnavailableError, WorkflowInputsError
from ...records import RecoveryReport, WorkflowStatus
from ...storage.rows import Runner
from ...storage.session import end_dead_local_sessions
from .core import Engine
from .notifications import CLAIMABLE_CHANNEL
from .registry import find_workflow, workflow_names
from .runs import Claim

log = logging.getLogger(__name__)

PAGE_SIZE = 200
_PROGRESS_EVERY_S = 5.0


def recover_pending(engine: Engine) -> RecoveryReport:
    """Recover this executor's recoverable PENDING workflows (run once at launch).

    Workflows of a session that lost its lock on another host are waited for
    during that session's grace (it may be alive and reconnecting), then taken.
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
        engine.last_recovery = report
        engine.recovery_done.set()
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
    """The PENDING workflows of dead sessions (``orphans``: of any executor id, else of
    this one's), page by page; each claim counts a recovery attempt."""
    db = engine.db
    assert engine.session_key is not None, "the runtime has no executor session"
    after = None
    last_progress = time.monotonic()
    while not engine.stopping:
        if engine.ownership_mark() < 0:  # not sure this session is alive to others: wait
            return
        claims = db.recovery.claim(
            executor_id=engine.executor_id,
            owner_key=engine.session_key,
            runner=runner,
            skip_ids=engine.active_ids(),
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
        runnable = [
            Claim(definition, claim.workflow_id, claim.inputs)
            for claim in live
            if (definition := find_workflow(claim.name)) is not None
        ]
        for future in engine.start_claimed(runnable):
            if future is None:
                continue
            if future.done() and isinstance(future.result().error, WorkflowInputsError):
                report.failed_inputs += 1
            else:
                report.recovered += 1
        if time.monotonic() - last_progress > _PROGRESS_EVERY_S:
            last_progress = time.monotonic()
            log.info("recovery in progress: %d recovered so far", report.recovered)


def _continue_diverged(
    engine: Engine, runner: Runner, *, orphans: bool, report: RecoveryReport
) -> None:
    """Take the DIVERGED workflows whose log this code may fit (its code version did not
    diverge on them: an older version still running, a fixed deploy) and run them from
    their logs; one that diverges again is held again, with this version added."""
    assert engine.session_key is not None
    while not engine.stopping and engine.ownership_mark() >= 0:
        page = engine.db.recovery.claim_diverged(
            executor_id=engine.executor_id,
            owner_key=engine.session_key,
            runner=runner,
            orphans=orphans,
            limit=PAGE_SIZE,
        )
        claims = [
            Claim(definition, workflow_id, inputs)
            for workflow_id, name, inputs in page
            if (definition := find_workflow(name)) is not None
        ]
        report.continued_diverged += sum(f is not None for f in engine.start_claimed(claims))
        if len(page) < PAGE_SIZE:
            return


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


def keep_taking_back(engine: Engine) -> None:
    """The take-back thread: after an outage (or now and then) recover what is ours."""
    while not engine.stopping:
        woken = engine.take_back_wanted.wait(engine.passes.take_back)
        engine.take_back_wanted.clear()
        urgent, engine.take_back_urgent = engine.take_back_urgent, False
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
    can run (a registered name, its application version). While there are none it costs
    one statement (``probe_orphans``), which also declares dead the sessions of processes
    gone from this host."""
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


def keep_taking_over(engine: Engine) -> None:
    """The take-over thread (every launched process has one unless launched with
    ``take_over=False``): every ``engine.passes.take_over`` seconds, and at once when a
    workflow becomes claimable (NOTIFY on dbos_agent_claimable: a resume without an
    owner, a session that ended leaving work, a workflow held DIVERGED), take over the
    workflows of dead sessions and the diverged ones this code may fit, of any executor;
    now and then forget long-dead executors."""
    wanted = threading.Event()
    engine.notifications.subscribe(CLAIMABLE_CHANNEL, lambda _: wanted.set())
    engine.on_wake_all(wanted.set)  # a moved clock (leases end), shutdown
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
