"""The typed errors dbos_agent raises. All derive from :class:`DbosAgentError`."""

from __future__ import annotations


class DbosAgentError(Exception):
    """Base class of every error raised by dbos_agent itself."""


class NotLaunchedError(DbosAgentError):
    """A durable workflow was called before ``dbos_agent.launch()``."""


class DatabaseUnavailableError(DbosAgentError):
    """The system database cannot be reached (the URL in the message has no password)."""


class CheckpointError(DbosAgentError):
    """The step log could not be written or read (the database failed, not the step).

    The workflow stops without recording an outcome and is recovered later;
    agent tools never hand this to the model as a tool error.
    """


class SchemaVersionError(DbosAgentError):
    """The database holds a dbos_agent schema newer than this library knows."""


class SerializationError(DbosAgentError, TypeError):
    """A value cannot be stored as JSON (or read back as the annotated type)."""


class WorkflowNotFoundError(DbosAgentError, LookupError):
    """No workflow with the given id exists."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"no workflow with id {workflow_id!r}")
        self.workflow_id = workflow_id


class WorkflowIdConflictError(DbosAgentError):
    """A workflow id was reused for a different workflow or different inputs."""


class WorkflowDivergedError(DbosAgentError):
    """On replay the code called a different step than the log recorded at that position."""

    def __init__(self, workflow_id: str, seq: int, recorded: str, current: str) -> None:
        super().__init__(
            f"workflow {workflow_id!r} diverged from its log at step {seq}: the log recorded "
            f"{recorded!r} but the code now calls {current!r}. The code changed in a way "
            f"that this workflow's history no longer fits; fork it from an earlier step "
            f"or run it again under a new id."
        )
        self.workflow_id = workflow_id
        self.seq = seq
        self.recorded = recorded
        self.current = current


class MaxRecoveryAttemptsExceededError(DbosAgentError):
    """A workflow was recovered more times than its ``max_recovery_attempts`` allows."""


class WorkflowCancelledError(DbosAgentError):
    """The workflow was cancelled; it stops at its next step boundary."""


class StepInDoubtError(DbosAgentError):
    """A non-idempotent step recorded its intent but no result, and has no guard.

    The effect may or may not have happened; the workflow stops in IN_DOUBT
    until an operator settles the step (:func:`dbos_agent.resolve_in_doubt`).
    """

    def __init__(self, workflow_id: str, seq: int, name: str) -> None:
        super().__init__(
            f"workflow {workflow_id!r} stopped at step {seq} ({name}): it is not idempotent, "
            f"it was started before a crash and no result was recorded, so it may or may not "
            f"have taken effect. Check the outside world, then settle it with "
            f"`dbos-agent steps resolve {workflow_id} {seq} --result JSON` (it happened) or "
            f"`--rerun` (it did not), or dbos_agent.resolve_in_doubt(...)."
        )
        self.workflow_id = workflow_id
        self.seq = seq
        self.name = name


class WorkflowInterruptedError(DbosAgentError):
    """This process stopped running the workflow (shutdown); it stays PENDING for recovery."""


class WorkflowInputsError(DbosAgentError):
    """A workflow's recorded inputs no longer fit its function's signature."""


class RecordedError(DbosAgentError):
    """Stands in for a recorded exception whose class cannot be rebuilt in this process.

    ``type_name`` is the original ``module.QualName``.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message


class WorkflowStatusError(DbosAgentError):
    """The workflow's status does not allow the operation (e.g. cancelling a finished one).

    ``status`` is the status it has; the message says what would be allowed.
    """

    def __init__(self, workflow_id: str, status: str, message: str) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.status = status
