"""Running the background passes of the launched runtime every few milliseconds.

The races that matter are between passes that pick up workflows: the waker, the take-back
of what this process owns but does not run, recovery and take-over. With their default
intervals (seconds) two of them rarely meet; a stress test makes them meet thousands of
times a minute and then checks, from outside the process, that no step ran twice.
"""

from __future__ import annotations

from ..engine.runtime.engine import current_engine


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
