"""The waker: wakes suspended workflows whose wait can be met, and runs them here.

See ``suspension.py`` for what suspension is. Every launched process runs one
waker thread. It wakes at once on the NOTIFY of a message (its payload names the
destination), an event (the publisher), a finished workflow awaited by another or an
operator's retry now (the workflow),
when the earliest suspended timer is due
(it sleeps until then), and sweeps every couple of seconds for what a lost NOTIFY
or another process's clock left behind. The sweep also cancels the workflows past
their deadline (``da.workflow_timeout``). Each wake is one guarded statement
(``wake_notified``, on the NOTIFY payloads or on what the sweep's
``list_wake_targets`` found); a workflow two wakers race for goes to one of them, and
one woken for a message receives it in that statement.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from .collaborators import BackgroundPass
from .core import Engine
from .notifications import EVENTS_CHANNEL, FINISHED_CHANNEL, MESSAGES_CHANNEL, RETRY_CHANNEL
from .registry import find_workflow
from .runs import Claim

log = logging.getLogger(__name__)

#: Workflows woken per statement.
_WAKE_PAGE = 100
#: The shortest pause between rounds (a due timer another waker holds at the moment).
_MIN_PAUSE_S = 0.02


class Waker(BackgroundPass):
    """Wakes suspended workflows whose wait can be met and runs them in this process. It
    listens for messages, events, finished workflows and retries from when it is made."""

    thread_name = "dbos-agent-waker"

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._targets: set[str] = set()
        self._sweep = True  # the first round sweeps: what came due while nobody ran
        self._wanted = threading.Event()
        self._swept_at = 0.0
        notifications = engine.notifications
        notifications.subscribe(MESSAGES_CHANNEL, self._notified)
        notifications.subscribe(EVENTS_CHANNEL, self._notified)
        notifications.subscribe(FINISHED_CHANNEL, self._notified)
        notifications.subscribe(RETRY_CHANNEL, self._notified)  # dbos-agent retry: now

    def poke(self, sweep: bool = True) -> None:
        """Look again now (the clock moved, shutdown, a wait was just suspended)."""
        with self._lock:
            self._sweep = self._sweep or sweep
        self._wanted.set()

    def wake(self) -> None:
        self.poke()

    def timer_added(self) -> None:
        self.poke(sweep=False)  # a new timer: sleep until it

    def _notified(self, payload: str) -> None:
        with self._lock:
            if payload:
                self._targets.add(payload)
            else:  # an id too long for a payload: look at everything
                self._sweep = True
        self._wanted.set()

    def run(self) -> None:
        """The waker thread: wake what can run, sleep until the next timer or NOTIFY."""
        engine = self._engine
        while not engine.stopping:
            self._wanted.clear()
            with self._lock:
                targets, self._targets = self._targets, set()
                sweep, self._sweep = self._sweep, False
            # a steady stream of NOTIFYs must not put the sweep off forever
            every = engine.passes.sweep
            sweep = sweep or time.monotonic() - self._swept_at >= every
            try:
                if targets:
                    wake(engine, sorted(targets))
                if sweep:
                    self._swept_at = time.monotonic()
                    sweep_once(engine)
                next_in = engine.db.suspension.next_wake_in(engine.runner())
            except Exception as exc:  # an outage: look again soon
                log.warning("waking suspended workflows failed (retrying): %s", exc)
                with self._lock:
                    self._targets |= targets
                    self._sweep = True
                next_in = 1.0
            pause = every if next_in is None else min(every, next_in)
            # An overdue timer another waker holds right now: look again very soon.
            if not self._wanted.wait(max(min(_MIN_PAUSE_S, every), pause)):
                with self._lock:
                    self._sweep = True  # a timer came due, or it is time to sweep


@dataclass(frozen=True)
class Sweep:
    """What one sweep did: the workflows it cancelled (past their deadline) and those it
    woke and started here."""

    cancelled: list[str]
    woken: list[str]


def sweep_once(engine: Engine) -> Sweep:
    """One sweep of the waker, now: cancel the workflows past their deadline, then wake
    and run every suspended workflow whose wait can be met.

    The waker thread runs it every ``passes.sweep`` seconds; tests call it (through
    ``dbos_agent.testing.sweep_once``) to say at once what a sweep does, or does not do,
    instead of sleeping past the next one.
    """
    return Sweep(cancelled=cancel_overdue(engine), woken=wake(engine, None))


def cancel_overdue(engine: Engine) -> list[str]:
    """Cancel the workflows past their deadline (see context.workflow_timeout); a run
    of one here stops before its next step. Returns their ids."""
    cancelled: list[str] = []
    while not engine.stopping:
        page = engine.db.operations.cancel_overdue(limit=_WAKE_PAGE)
        for workflow_id in page:
            engine.note_cancelled(workflow_id)
        cancelled += page
        if len(page) < _WAKE_PAGE:
            break
    return cancelled


def wake(engine: Engine, targets: list[str] | None) -> list[str]:
    """Wake and run every workflow that can run now: those waiting on ``targets``,
    or any (None). One statement per page of workflows, one read of their logs.
    Returns the ids of the workflows woken here."""
    woken_ids: list[str] = []
    while not engine.stopping and engine.session_key is not None:
        woken = engine.db.suspension.wake(
            owner_key=engine.session_key,
            executor_id=engine.executor_id,
            runner=engine.runner(),
            targets=targets,
            limit=_WAKE_PAGE,
        )
        engine.start_claimed(
            [
                Claim(definition, workflow.workflow_id, workflow.inputs)
                for workflow in woken
                # unregistered since: recovery will see it
                if (definition := find_workflow(workflow.name)) is not None
            ]
        )
        woken_ids += [workflow.workflow_id for workflow in woken]
        if len(woken) < _WAKE_PAGE:
            break
    return woken_ids
