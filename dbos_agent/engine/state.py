"""All the process-wide state of dbos_agent, in one place a test can see and reset.

Four things are per process by nature: the launched engine (one executor session
per process), the workflow functions the decorators registered (recovery finds the
function of a row written by another process by its name), and the queues and cron
schedules the application defined. Everything else is passed along: the engine to what it runs, a
workflow context to its steps.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from ..errors import NotLaunchedError

if TYPE_CHECKING:
    from .core import Engine
    from .queues import Queue
    from .registry import WorkflowDefinition
    from .schedules import Schedule

_lock = threading.RLock()
_engine: Engine | None = None
#: The engine of a replay check running in this context (see deploy_check.py): the
#: workflows it replays find it, not the launched one, when they start others.
_replaying: ContextVar[Engine | None] = ContextVar("dbos_agent_replaying", default=None)
#: ``@durable_workflow`` definitions by workflow name.
workflows: dict[str, WorkflowDefinition] = {}
#: ``Queue`` objects by queue name.
queues: dict[str, Queue] = {}
#: The modules that define durable code (workflows, steps), each with a digest of its
#: source as imported: the process's code version is made of them (registry.py).
code_modules: dict[str, str] = {}
#: ``@scheduled`` schedules by schedule name.
schedules: dict[str, Schedule] = {}


def lock() -> threading.RLock:
    """The lock that guards every change to this module's state."""
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
    """The engine of the launched engine, or None."""
    return _engine


@contextmanager
def replaying(engine: Engine) -> Iterator[None]:
    """Make ``engine`` (a replay check's) the current one in this context, for the block."""
    token = _replaying.set(engine)
    try:
        yield
    finally:
        _replaying.reset(token)


def set_engine(engine: Engine) -> None:
    """Make ``engine`` the process's; only one at a time (call under :func:`lock`)."""
    global _engine
    _engine = engine


def clear_engine(engine: Engine) -> None:
    """Forget ``engine`` if it is the launched one (its shutdown calls this)."""
    global _engine
    with _lock:
        if _engine is engine:
            _engine = None


def forget_queues() -> None:
    """Forget every defined queue (for tests: the next test defines its own)."""
    with _lock:
        queues.clear()


def forget_workflows() -> None:
    """Forget every registered workflow (for tests that define them on the fly)."""
    with _lock:
        workflows.clear()


def forget_schedules(*names: str) -> None:
    """Forget the named schedules, or every one (for tests that define them on the fly:
    a later launch in the same process must not fire them)."""
    with _lock:
        if not names:
            schedules.clear()
        for name in names:
            schedules.pop(name, None)
