"""Running the background passes of the launched runtime every few milliseconds, or
once, now.

The races that matter are between passes that pick up workflows: the waker, the take-back
of what this process owns but does not run, recovery and take-over. With their default
intervals (seconds) two of them rarely meet; a stress test makes them meet thousands of
times a minute and then checks, from outside the process, that no step ran twice.

A test that checks what a pass must *not* do (start a workflow a queue's limit holds,
cancel a workflow that finished in time) runs the pass once itself and looks at once,
instead of sleeping longer than the pass's interval and hoping it ran meanwhile.
"""

from __future__ import annotations

from ..engine.queues import dispatch_once as _dispatch_once
from ..engine.runtime.engine import current_engine
from ..engine.runtime.recovery import take_over_once as _take_over_once
from ..engine.runtime.waking import Sweep
from ..engine.runtime.waking import sweep_once as _sweep_once
from ..records import RecoveryReport


def run_passes_every(seconds: float) -> None:
    """Make each background pass of the launched runtime look every ``seconds`` (e.g.
    0.005) whether or not something woke it, from its next round on."""
    if not seconds > 0:
        raise ValueError(f"run_passes_every: seconds must be > 0, got {seconds!r}")
    engine = current_engine()
    engine.passes.take_back = seconds
    engine.passes.sweep = seconds
    engine.passes.take_over = seconds
    engine.take_back_wanted.set()


def sweep_once() -> Sweep:
    """Run one sweep of the waker in the launched runtime now (whether or not it was
    launched with ``wake_suspended``): cancel the workflows past their deadline, wake and
    start the suspended workflows whose wait can be met. Returns what it did."""
    return _sweep_once(current_engine())


def dispatch_once() -> int:
    """Run one pass of the queue dispatcher in the launched runtime now: dequeue what
    the queues' limits and this process's free slots allow. Returns how many started."""
    return _dispatch_once(current_engine())


def take_over_once() -> RecoveryReport:
    """Run one take-over pass in the launched runtime now: take over the workflows of
    dead sessions that this process can run (a registered name, its application
    version). Returns what it did."""
    return _take_over_once(current_engine())
