"""The runs of this process: one per workflow it executes, from admission to finish.

The table is what makes a workflow run once per process: a second call of a workflow
that runs here attaches to its future, and recovery skips it. It also holds what the
process noted about its runs: which were cancelled (a flag checked at every step
boundary), and which it stopped for good (``parked``: a failure retrying will not fix).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..._storage.rows import StepRow
from ...errors import WorkflowIdConflictError
from .outcome import Outcome
from .registry import WorkflowDefinition


@dataclass(eq=False)
class WorkflowRun:
    """One execution of a workflow by this process, from admission to finish."""

    definition: WorkflowDefinition
    workflow_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    recorded: dict[int, StepRow]
    future: Future[Outcome] = field(default_factory=Future)
    #: The session streak in which this process became the owner (-1: check first).
    owned_streak: int = -1
    #: Run by the worker pool (not in a caller's thread): its long waits suspend.
    background: bool = False


#: A check of a second call under a workflow id against the first one:
#: ``(workflow_id, name, inputs, other_name, other_inputs)``.
SameCall = Callable[[str, str, str, str, str], None]


def check_same_function(
    workflow_id: str, name: str, inputs: str, other_name: str, other_inputs: str
) -> None:
    """A second call under a workflow id must be of the same function, else it is a
    WorkflowIdConflictError (its inputs are not compared: a replayed child start)."""
    if name != other_name:
        raise WorkflowIdConflictError(
            f"workflow id {workflow_id!r} already belongs to workflow {other_name!r}, not {name!r}"
        )


def check_same_call(
    workflow_id: str, name: str, inputs: str, other_name: str, other_inputs: str
) -> None:
    """A second call under a workflow id must be of the same function with the same
    inputs (JSON-equal), else it is a WorkflowIdConflictError."""
    check_same_function(workflow_id, name, inputs, other_name, other_inputs)
    if inputs != other_inputs and json.loads(inputs) != json.loads(other_inputs):
        raise WorkflowIdConflictError(
            f"workflow id {workflow_id!r} was already used for {name!r} with other inputs "
            f"(recorded {other_inputs}, now {inputs})"
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """A workflow a statement just gave this session, to run from its log (see
    :meth:`Engine.start_claimed`): its function and its recorded inputs."""

    definition: WorkflowDefinition
    workflow_id: str
    inputs: str


@dataclass(frozen=True, slots=True)
class ActiveRun:
    """What a second call of a running workflow is checked against, and waits on."""

    name: str
    inputs: str
    future: Future[Outcome]


@dataclass(frozen=True, slots=True)
class Admission:
    """What a workflow call must do: run it, wait for this process's run, or return."""

    run: WorkflowRun | None = None
    attached: Future[Outcome] | None = None
    finished: Outcome | None = None
    #: Another session runs it (or it waits in a queue): wait on the database.
    remote: bool = False

    def future(self) -> Future[Outcome] | None:
        """The in-process future to wait on; None when only the database can tell."""
        if self.run is not None:
            return self.run.future
        if self.attached is not None:
            return self.attached
        if self.remote:
            return None
        done: Future[Outcome] = Future()
        done.set_result(self.finished or Outcome())
        return done


class RunTable:
    """The workflows this process runs now, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, ActiveRun] = {}
        self._cancelled: set[str] = set()
        self._parked: set[str] = set()

    def claim(self, run: WorkflowRun, inputs: str) -> ActiveRun | None:
        """Register ``run``; if this process already runs the workflow, that run instead."""
        with self._lock:
            active = self._active.get(run.workflow_id)
            if active is None:
                self._active[run.workflow_id] = ActiveRun(run.definition.name, inputs, run.future)
            return active

    def release(self, run: WorkflowRun) -> None:
        """``run`` ended here (with or without an outcome): forget it and its flags."""
        with self._lock:
            active = self._active.get(run.workflow_id)
            if active is not None and active.future is run.future:
                del self._active[run.workflow_id]
                self._cancelled.discard(run.workflow_id)

    def ids(self) -> list[str]:
        """Ids of the workflows this process runs now."""
        with self._lock:
            return list(self._active)

    def future(self, workflow_id: str) -> Future[Outcome] | None:
        """The future of this process's run of ``workflow_id``, if it runs it."""
        with self._lock:
            active = self._active.get(workflow_id)
        return active.future if active else None

    def futures(self) -> list[Future[Outcome]]:
        """The futures of every run, e.g. to wait for them at shutdown."""
        with self._lock:
            return [active.future for active in self._active.values()]

    def flag_cancelled(self, workflow_id: str) -> None:
        """Note a cancel of a workflow that runs here (others are not tracked)."""
        with self._lock:
            if workflow_id in self._active:
                self._cancelled.add(workflow_id)

    def cancel_flagged(self, workflow_id: str) -> bool:
        """Whether a cancel is noted for ``workflow_id`` and not yet acted on."""
        return workflow_id in self._cancelled

    def take_cancel_flag(self, workflow_id: str) -> bool:
        """Whether a cancel was noted for ``workflow_id`` (clearing it). One set lookup in
        the common case: it is asked at every step boundary."""
        if workflow_id not in self._cancelled:
            return False
        with self._lock:
            self._cancelled.discard(workflow_id)
        return True

    def park(self, workflow_id: str) -> None:
        """This process will not take the workflow back by itself (see ``parked``)."""
        with self._lock:
            self._parked.add(workflow_id)

    def parked(self) -> list[str]:
        """Workflows stopped for a failure that retrying here will not fix."""
        with self._lock:
            return list(self._parked)
