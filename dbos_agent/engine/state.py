"""All the process-wide state of dbos_agent, in one place a test can see and reset.

Three things are per process by nature: the launched runtime (one executor session
per process), the workflow functions the decorators registered (recovery finds the
function of a row written by another process by its name), and the queues the
application defined. Everything else is passed along: a runtime to what it runs, a
workflow context to its steps.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..errors import NotLaunchedError

if TYPE_CHECKING:
    from .queues import Queue
    from .registry import WorkflowDefinition
    from .runtime import Runtime

_lock = threading.RLock()
_runtime: Runtime | None = None
#: ``@durable_workflow`` definitions by workflow name.
workflows: dict[str, WorkflowDefinition] = {}
#: ``Queue`` objects by queue name.
queues: dict[str, Queue] = {}


def lock() -> threading.RLock:
    """The lock that guards every change to this module's state."""
    return _lock


def current_runtime() -> Runtime:
    """The launched runtime of this process."""
    runtime = _runtime
    if runtime is None:
        raise NotLaunchedError(
            "dbos_agent is not launched: call dbos_agent.launch() before running durable workflows"
        )
    return runtime


def launched() -> Runtime | None:
    """The launched runtime, or None."""
    return _runtime


def set_runtime(runtime: Runtime) -> None:
    """Make ``runtime`` the process's; only one at a time (call under :func:`lock`)."""
    global _runtime
    _runtime = runtime


def clear_runtime(runtime: Runtime) -> None:
    """Forget ``runtime`` if it is the launched one (its shutdown calls this)."""
    global _runtime
    with _lock:
        if _runtime is runtime:
            _runtime = None


def forget_queues() -> None:
    """Forget every defined queue (for tests: the next test defines its own)."""
    with _lock:
        queues.clear()


def forget_workflows() -> None:
    """Forget every registered workflow (for tests that define them on the fly)."""
    with _lock:
        workflows.clear()
