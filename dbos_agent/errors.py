"""Every error dbos_agent raises, in one public module (the top level re-exports the few
caught most). The engine's derive from :class:`DbosAgentError`; the agent layer's, its
integrations' and the provisioning's are here too, at the end, with the bases they always
had (a tool's refusal or failure result is a plain ``Exception`` the model sees; calling an
async-only MCP tool from sync code is a ``TypeError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp import ClientSession


class DbosAgentError(Exception):
    """Base class of every error raised by dbos_agent itself."""


class NotLaunchedError(DbosAgentError):
    """A durable workflow was called before ``dbos_agent.launch()``."""


class DatabaseUnavailableError(DbosAgentError):
    """The system database could not be reached, also after retrying for the outage bound.

    Library calls ride out outages (connection refused or closed, an admin shutdown, a
    read-only server during failover) by retrying with backoff; this is raised only
    once the bound (``launch(outage_timeout=...)``) has passed. A workflow whose run
    stops with it stays PENDING and continues when the database is back: a database
    outage is never recorded as a workflow's error. The message never holds a password.

    ``retryable`` is False when the database answered but failed in a way waiting will
    not fix (e.g. a dropped table): the workflow then waits for an operator and the
    next process instead of being retried here.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class DatabaseClosedError(DatabaseUnavailableError):
    """The runtime or client was shut down: its connections are closed, and no call
    through it can succeed again (launch a new runtime, or open a new client)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class QueueConflictError(DbosAgentError, ValueError):
    """A second ``da.Queue`` was created under a name already used, with other settings."""


class CheckpointError(DatabaseUnavailableError):
    """The step log could not be written (the database failed, not the step).

    The workflow stops without recording an outcome and stays PENDING, even if user
    code catches this; agent tools never hand it to the model as a tool error.
    """


class ConfigurationError(DbosAgentError):
    """The process lacks configuration a step needs: a model client, an API key.

    That is not the step's outcome, so it is never recorded: the run stops, the workflow
    stays PENDING, and a process that has the configuration continues it (the next
    recovery, a restarted worker, ``resume``). The message never holds a secret.
    """


class UnsupportedDatabaseError(ConfigurationError):
    """The database URL names another database than PostgreSQL (``mysql://...``): the
    message names its scheme, with the password masked."""


class InvalidDatabaseUrlError(ConfigurationError, ValueError):
    """The database URL (or key=value connection string) cannot be read as meant: libpq
    cannot parse it (a space or ``%`` that is not an escape, an IPv6 host without its
    ``]``), or would read part of its password as the host, port or database name (an
    unencoded ``/`` or ``@``). The message says what is wrong and never shows the string,
    which may hold a password."""


class PoolerError(ConfigurationError):
    """A connection pooler where the library cannot work through it as configured: a
    pooled URL (``?pooler=transaction``, or a pooler seen refusing a startup option or
    losing a prepared statement) given where a direct connection is required (migrations,
    ``session_url``), or a transaction pooler the database URL does not declare. The
    message names the URL (password masked) and the fix; see docs/pooled-urls.md."""


class SchemaVersionError(DbosAgentError):
    """The database's dbos_agent schema is not the one this library uses: here, newer
    than it knows (upgrade dbos_agent); :class:`SchemaNotMigratedError`, missing or older."""


class SchemaNotMigratedError(SchemaVersionError):
    """The database has no dbos_agent schema, or an older one, and what opened it does
    not change schemas (``Client``, the CLI, ``serve``): only ``launch()`` and
    ``dbos-agent migrate`` do. The message names the command to run, password masked."""


class NoDatabaseError(DbosAgentError):
    """No database to open: none was named (``--database-url``,
    ``$DBOS_AGENT_DATABASE_URL``) and the embedded one under ``./.dbos_agent/`` is absent
    (only what may create it starts a new one) or cannot be started."""


class InvalidDurationError(DbosAgentError, ValueError):
    """A duration or moment that cannot be read (``gc --older-than 3 days``, ``since=soon``):
    the message says what was given and the forms that are read."""


class InvalidOptionError(DbosAgentError, ValueError):
    """An option of a decorator or constructor is out of its range or not of its type
    (``give_up_after=-1``, ``give_up_after="1h"``): raised where it is given, before
    anything runs, naming the option and what it got."""


class DependencyUnavailableError(DbosAgentError):
    """Something a step depends on cannot be reached now: an MCP server that does not
    start or answer, a connection that broke before the request was sent.

    A step that fails with it waits the outage out durably instead of recording it (see
    ``give_up_after`` of ``@da.step``); only past that horizon is it recorded, as the
    step's error. Its message names the dependency without its secrets.
    """


class SerializationError(DbosAgentError, TypeError):
    """A value cannot be stored as JSON (or read back as the annotated type).

    Also raised when Postgres refuses a value (e.g. a number out of its range): that
    is the value's fault, never a database outage, so it is the caller's error.
    """


class CheckpointTooLargeError(SerializationError):
    """A value is larger than ``launch(max_checkpoint_bytes=...)`` allows; it was not written.

    ``size`` and ``limit`` are in bytes of JSON text; the message names the workflow and
    the step (or the input, output, message or event) the value belonged to. A step's value
    too large to record is the step's outcome: this error is recorded in its place, once
    (a replay raises it again; a tool's reaches the model as an error result).
    """

    def __init__(self, where: str, size: int, limit: int) -> None:
        super().__init__(where, size, limit)  # the args rebuild it when replayed
        self.where, self.size, self.limit = where, size, limit

    def __str__(self) -> str:
        return (
            f"{self.where}: the value is {self.size:,} bytes of JSON, over the checkpoint "
            f"limit of {self.limit:,} bytes (launch(max_checkpoint_bytes=...)); it was not "
            f"written. Store large data elsewhere (a file, object storage) and checkpoint a "
            f"reference to it."
        )


class InvalidIdentifierError(DbosAgentError, ValueError):
    """A workflow id, topic, key or name is empty, too long, or holds a NUL character."""


class ScheduleError(DbosAgentError, ValueError):
    """A schedule (``@da.scheduled``) is defined wrongly, or an action on one was refused.

    Raised at decoration time for a bad cron expression, an unknown time zone, an unknown
    ``catch_up`` or ``overlap`` policy, a function that is not a durable workflow taking
    one ``datetime``, or a name another function's schedule has; and for a backfill whose
    range holds too many slots. The message names the schedule and what was wrong.
    """


class ScheduleNotFoundError(DbosAgentError, LookupError):
    """No schedule with the given name is recorded in the database."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no schedule named {name!r} (a schedule is recorded when a process that defines "
            f"it launches; `dbos-agent schedules` lists them)"
        )
        self.name = name


class WorkflowNotFoundError(DbosAgentError, LookupError):
    """No workflow with the given id exists."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"no workflow with id {workflow_id!r}")
        self.workflow_id = workflow_id


class DuplicateEnqueueError(DbosAgentError):
    """An enqueue with a deduplication id that an unfinished workflow of the same queue
    already holds (``Queue.enqueue(..., dedup_id=)``): nothing was enqueued."""

    def __init__(self, queue_name: str, dedup_id: str, workflow_id: str) -> None:
        super().__init__(queue_name, dedup_id, workflow_id)  # the args rebuild it when replayed
        self.queue_name = queue_name
        self.dedup_id = dedup_id
        self.workflow_id = workflow_id

    def __str__(self) -> str:
        return (
            f"refused to enqueue workflow {self.workflow_id!r} on queue {self.queue_name!r}: "
            f"deduplication id {self.dedup_id!r} is held by an unfinished workflow of that "
            f"queue (it may be used again once that one finishes)"
        )


class PartitionKeyError(DbosAgentError, ValueError):
    """An enqueue on a partitioned queue without a partition key, or with one on a queue
    that is not partitioned (``Queue(..., partitioned=True)``): nothing was enqueued."""

    def __init__(self, queue_name: str, partition_key: str | None) -> None:
        if partition_key is None:
            message = (
                f"queue {queue_name!r} is partitioned: an enqueue on it needs a "
                f"partition_key (the tenant whose limits it counts against)"
            )
        else:
            message = (
                f"queue {queue_name!r} is not partitioned: partition_key {partition_key!r} "
                f"is only for a queue defined with partitioned=True"
            )
        super().__init__(message)
        self.queue_name = queue_name
        self.partition_key = partition_key


class WorkflowIdConflictError(DbosAgentError):
    """A workflow id was reused for a different workflow or different inputs."""


class WorkflowDivergedError(DbosAgentError):
    """On replay the code called a different step than the log recorded at that position.

    A code change, not the workflow's error: the engine holds the workflow as DIVERGED
    (unfinished) until code that fits its log continues it. Raised by user code, it is
    recorded as that workflow's error like any other exception.
    """

    def __init__(self, workflow_id: str, seq: int, recorded: str, current: str) -> None:
        self.detail = (
            f"at step {seq} the log recorded {recorded!r} but the code now calls {current!r}"
        )
        super().__init__(
            f"workflow {workflow_id!r} diverged from its log: {self.detail}. The code "
            f"changed in a way that this workflow's history does not fit; it is held as "
            f"DIVERGED, not failed: code that fits continues it (an older version still "
            f"running, or the change made with da.patched), or fork it from an earlier "
            f"step, or cancel it."
        )
        self.workflow_id = workflow_id
        self.seq = seq
        self.recorded = recorded
        self.current = current


class WriteRefusedError(DbosAgentError):
    """A statement that would write was sent on a read-only connection (a replay check's:
    ``dbos-agent check-deploy`` writes nothing unless asked to adopt)."""


class DeployCheckError(DbosAgentError):
    """``dbos-agent check-deploy`` could not check the new code: importing the app raised,
    exited, hung past ``--timeout``, crashed, left a non-daemon thread running or tried to
    launch a runtime, or the code ended the check's process. Nothing was checked (exit
    status 2), so a CI gate fails rather than passing on nothing."""


class InvalidHistoryError(DbosAgentError, ValueError):
    """A line of an export (``dbos-agent import``, ``check-deploy --histories``) breaks a
    rule of the engine or the schema; the message names the file, the line and the field.
    Nothing of the file was written."""


class PatchError(DbosAgentError):
    """A patch name (``da.patched``) used at two places of one workflow run: each change
    needs its own name, or replay could not tell them apart."""


class NotInWorkflowError(DbosAgentError):
    """A call that only makes sense in a durable workflow's function (``recv``,
    ``set_event``, ``patched``...) was made outside one, or inside a step."""


class NotInStepError(DbosAgentError):
    """A call that only makes sense inside a step running in a durable workflow
    (``da.step_info()``) was made elsewhere."""


class MaxRecoveryAttemptsExceededError(DbosAgentError):
    """A workflow was recovered more times than its ``max_recovery_attempts`` allows."""


class WorkflowCancelledError(DbosAgentError):
    """The workflow was cancelled; it stops at its next step boundary."""


class WorkflowTimeoutError(WorkflowCancelledError):
    """The workflow passed its deadline (:func:`dbos_agent.workflow_timeout`) unfinished:
    it was cancelled, with the workflows it started."""


class BudgetExceededError(DbosAgentError):
    """A model call was refused: the workflow's family (its root and every workflow started
    below it) has spent, or this call could spend, more than the model's budget."""


class ApprovalError(DbosAgentError):
    """A decision on an approval request was refused: no such request, another digest
    (the approval is for other arguments), already decided, or the workflow no longer
    waits."""


class StreamClosedError(DbosAgentError):
    """The stream was closed (``da.close_stream``): nothing more may be written to it."""


class StepInDoubtError(DbosAgentError):
    """A non-idempotent step recorded its intent but no result, and has no guard.

    The effect may or may not have happened; the workflow stops in IN_DOUBT
    until an operator resolves the step (:func:`dbos_agent.operations.resolve_in_doubt`).
    """

    def __init__(self, workflow_id: str, seq: int, name: str) -> None:
        super().__init__(
            f"workflow {workflow_id!r} stopped at step {seq} ({name}): it is not idempotent, "
            f"it was started before a crash and no result was recorded, so it may or may not "
            f"have taken effect. Check the outside world, then resolve it with "
            f"`dbos-agent steps resolve {workflow_id} {seq} --result JSON` (it happened) or "
            f"`--rerun` (it did not), or dbos_agent.operations.resolve_in_doubt(...)."
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


class ForkEditError(DbosAgentError, ValueError):
    """An edited fork's edit does not fit: an input the workflow's signature refuses, a
    replaced step that is no recorded result of that name below the fork point, or an
    output its step's return annotation refuses. Nothing was written.

    ``where`` names the edit (``"inputs"``, ``"inputs.query"``, ``"step 3"``); the
    message says what was wrong there.
    """

    def __init__(self, workflow_id: str, where: str, reason: str) -> None:
        super().__init__(f"cannot fork workflow {workflow_id!r} with edits: {where}: {reason}")
        self.workflow_id = workflow_id
        self.where = where
        self.reason = reason


class PostgresNotFoundError(RuntimeError):
    """No usable PostgreSQL server binaries (initdb, pg_ctl, postgres) were found; the
    message says how to install them."""


# -- the agent layer (dbos_agent.agent) --------------------------------------------------


class ToolInputError(Exception):
    """A tool call the registry refused: unknown tool name or input that fails validation."""


class ToolCallRejected(Exception):
    """A human rejected the tool call (its tool requires approval)."""


class ToolErrorResult(Exception):
    """A tool's own failure result (an MCP ``isError`` result): recorded as the step's
    value, and handed to the model as an ``is_error`` tool result with this text."""


class AsyncOnlyToolError(TypeError):
    """An MCP tool called from sync code where it cannot run: its ``ClientSession``
    belongs to an event loop that this thread would block (or that is not running)."""


class McpConnectionError(DependencyUnavailableError):
    """The connection to an MCP server failed: the server died, closed its pipes, never
    came up or cannot be reached. A step that fails with it waits for the server (see
    ``dbos_agent.agent.mcp``); a non-idempotent call that may have reached the server gets
    an ``isError`` result instead. Its message names the server without its secrets.

    ``sent``: the request may have reached the server; ``session``: the one that broke.
    """

    def __init__(self, message: str, *, sent: bool, session: ClientSession | None) -> None:
        super().__init__(message)
        self.sent = sent
        self.session = session

    @classmethod
    def of(cls, exc: BaseException, session: ClientSession, *, sent: bool) -> McpConnectionError:
        return cls(str(exc) or type(exc).__name__, sent=sent, session=session)


# -- the Pydantic AI integration (dbos_agent.integrations.pydantic_ai) ------------------


class UnsupportedPydanticAIVersionError(ConfigurationError):
    """The installed Pydantic AI is not one this integration supports."""


class RecordedModelError(DbosAgentError):
    """A model error as the step log keeps it: Pydantic AI's encoding of the
    ``ModelAPIError`` (its class and fields), so that replay raises the same error again,
    status code and body included, where the plain record would keep only the message.
    The integration turns it back into the original error (``encoded``) when it raises."""

    def __init__(self, message: str, encoded: dict[str, Any]) -> None:
        super().__init__(message, encoded)
        self.encoded = encoded

    def __str__(self) -> str:
        return str(self.args[0])


class UnavailableModelError(RecordedModelError, DependencyUnavailableError):
    """A model error that may pass by itself (the provider overloaded, rate-limiting,
    failing or unreachable): the request's step waits it out instead of recording it, up
    to its horizon; recorded past that, it replays as the original."""
