"""Plain value types shared by every layer: statuses and the read-only views of rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class WorkflowStatus(StrEnum):
    """A workflow's lifecycle state, stored as this exact string."""

    PENDING = "PENDING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"
    ENQUEUED = "ENQUEUED"
    MAX_RECOVERY_ATTEMPTS_EXCEEDED = "MAX_RECOVERY_ATTEMPTS_EXCEEDED"
    #: Stopped at a non-idempotent step that may or may not have taken effect.
    IN_DOUBT = "IN_DOUBT"

    @property
    def finished(self) -> bool:
        """True once the workflow will not run again by itself."""
        return self not in (WorkflowStatus.PENDING, WorkflowStatus.ENQUEUED)


class StepStatus(StrEnum):
    """A recorded step's outcome; PENDING is the intent of a non-idempotent step."""

    PENDING = "PENDING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """One workflow as stored. ``inputs``/``output``/``error`` are the stored JSON values."""

    workflow_id: str
    name: str
    status: WorkflowStatus
    inputs: Any
    output: Any
    error: dict[str, Any] | None
    executor_id: str
    app_version: str | None
    recovery_attempts: int
    max_recovery_attempts: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One recorded step. ``output``/``error`` are the stored JSON values."""

    workflow_id: str
    seq: int
    name: str
    status: StepStatus
    output: Any
    error: dict[str, Any] | None
    attempts: int
    started_at: datetime
    finished_at: datetime | None
    #: The recorded inputs of a non-idempotent step's intent (else None).
    inputs: Any = None

    @property
    def duration_ms(self) -> float | None:
        """Wall time of the step's live execution, retries included."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds() * 1000.0
