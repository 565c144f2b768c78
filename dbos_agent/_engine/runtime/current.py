"""The process's engine: one launched per process (one executor session), found by the
calls that run workflows; a replay check's engine stands in for it in the workflows that
check replays. Tests see and reset it through :func:`launched` and :func:`clear_engine`.

What the decorators and definitions register (workflows, queues, schedules) lives
beside what registers it: ``registry.py``, ``_engine/queues.py``, ``_engine/schedules/``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from ...errors import NotLaunchedError

if TYPE_CHECKING:
    from .core import Engine

_lock = threading.RLock()
_engine: Engine | None = None
#: The engine of a replay check running in this context (see deploy_check.py): the
#: workflows it replays find it, not the launched one, when they start others.
_replaying: ContextVar[Engine | None] = ContextVar("dbos_agent_replaying", default=None)


def launch_lock() -> threading.RLock:
    """The lock a launch holds while it checks that no engine runs and sets its own."""
    return _lock


def current_engine() -> Engine:
    """The engine of the launched runtime of this process (in a workflow that a replay
    check replays: the check's)."""
    engine = _replaying.get() or _engine
    if engine is None:
        raise NotLaunchedError(
            "dbos_agent is not launched: call dbos_agent.launch() before running durable workflows"
        )
    return engine


def launched() -> Engine | None:
    """The launched engine, or None."""
    return _engine


@contextmanager
def standing_in(engine: Engine) -> Iterator[None]:
    """Make ``engine`` (a replay check's) the current one in this context, for the block."""
    token = _replaying.set(engine)
    try:
        yield
    finally:
        _replaying.reset(token)


def set_engine(engine: Engine) -> None:
    """Make ``engine`` the process's; only one at a time (call under :func:`launch_lock`)."""
    global _engine
    _engine = engine


def clear_engine(engine: Engine) -> None:
    """Forget ``engine`` if it is the launched one (its shutdown calls this)."""
    global _engine
    with _lock:
        if _engine is engine:
            _engine = None
