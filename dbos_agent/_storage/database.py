"""The system database: the only door to Postgres, one store per concern behind it.

``db.workflows`` (recording calls and outcomes), ``db.steps`` (the step log: where a
step is checkpointed), ``db.recovery`` (claims and dead sessions), ``db.queues``,
``db.messages`` (messages, events, the database clock), ``db.suspension`` (suspended
workflows and what wakes them), ``db.operations`` (cancel, resume, fork),
``db.retention``, ``db.histories`` (deploy checks, export and import), ``db.schedules``
(cron schedules: firing a slot), ``db.versions`` (what each application version has
unfinished, and its live sessions) and ``db.inspection`` (read-only questions for tests and
tools). Every statement is named in ``dbos_agent/sql/queries.sql``; how statements run
(the pool, outages, values checked) is in ``connector.py``.

What needs a session of its own (the executor session's advisory lock, ``LISTEN``, and
migrations) goes to :attr:`SystemDatabase.direct`: the database URL itself, unless it goes
through a transaction pooler; then the ``session_url`` given beside it (a direct URL of
the same database), else nothing: the process then judges its liveness by its lease alone
and polls instead of listening (see ``session.py`` and docs/pooled-urls.md).
"""

from __future__ import annotations

from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES
from ..errors import PoolerError
from . import migrations
from .approvals import ApprovalStore
from .connector import Connector
from .histories import HistoryStore
from .inspection import InspectionStore
from .log_writes import LogWrites
from .messaging import MessageStore
from .operations import OperationStore
from .outages import DEFAULT_OUTAGE_TIMEOUT_S
from .queues import QueueStore
from .recovery import RecoveryStore
from .retention import RetentionStore
from .schedules import ScheduleStore
from .steps import StepStore
from .streams import StreamStore
from .suspension import SuspensionStore
from .versions import VersionStore
from .workflows import WorkflowStore


class SystemDatabase(Connector):
    """A pool of connections to the system database and the stores that use it.

    ``session_url`` is a direct URL of the same database, for what a transaction pooler
    cannot carry when the database URL goes through one (``?pooler=transaction``).
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 20,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT_S,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        application_name: str = "dbos_agent",
        warn_on_outage: bool = True,
        read_only: bool = False,
        session_url: str | None = None,
    ) -> None:
        super().__init__(
            url,
            pool_size=pool_size,
            outage_timeout=outage_timeout,
            max_checkpoint_bytes=max_checkpoint_bytes,
            application_name=application_name,
            warn_on_outage=warn_on_outage,
            read_only=read_only,
        )
        #: The checkpoints and outcomes of concurrent workflows, written together.
        self.log_writes = LogWrites(self)
        self.workflows = WorkflowStore(self, self.log_writes)
        self.steps = StepStore(self, self.log_writes)
        self.recovery = RecoveryStore(self)
        self.queues = QueueStore(self)
        self.messages = MessageStore(self)
        self.operations = OperationStore(self)
        self.retention = RetentionStore(self)
        self.suspension = SuspensionStore(self)
        self.streams = StreamStore(self)
        self.approvals = ApprovalStore(self)
        self.schedules = ScheduleStore(self)
        self.versions = VersionStore(self)
        self.inspection = InspectionStore(self)
        self.histories = HistoryStore(self)
        #: Where what needs a session of its own connects (the session's lock, LISTEN,
        #: migrations); None through a pooler without a ``session_url``.
        self.direct: Connector | None = None if self.pooled else self
        if session_url is not None:
            self.direct = _direct(session_url, self, outage_timeout, warn_on_outage)

    def migrate(self) -> int:
        """Apply the missing migrations, on :attr:`direct`; returns the schema version now
        in force. Refused through a pooler without a direct URL (PoolerError)."""
        target = self.direct
        if target is None:
            raise PoolerError(
                f"cannot apply the dbos_agent schema through the pooled URL "
                f"{self.redacted_url}: migrations need a direct connection to the server. "
                f"{MIGRATE_DIRECTLY}"
            )
        try:
            return migrations.migrate(target)
        finally:
            if target is not self:
                target.release_idle()

    def close(self) -> None:
        """Close every pooled connection (the direct URL's too)."""
        super().close()
        if self.direct is not None and self.direct is not self:
            self.direct.close()

    def schema_version(self) -> int:
        """The newest migration applied (0 before the first :meth:`migrate`)."""
        return migrations.schema_version(self)


#: The fix for a migration through a pooler, said wherever one is refused.
MIGRATE_DIRECTLY = (
    "Run `dbos-agent migrate --database-url DIRECT_URL` with the server's direct URL (not "
    "the pooler's), or give launch() that URL as session_url ($DBOS_AGENT_SESSION_URL) to "
    "migrate at launch; see docs/pooled-urls.md"
)


def _direct(
    session_url: str, db: SystemDatabase, outage_timeout: float, warn_on_outage: bool
) -> Connector:
    """The connector of ``session_url``: refused when it is declared pooled. Its pool
    opens a connection only to migrate (released after)."""
    direct = Connector(
        session_url,
        pool_size=1,
        outage_timeout=outage_timeout,
        application_name=db.application_name,
        warn_on_outage=warn_on_outage,
        role="the session URL",
    )
    if direct.pooled:
        raise PoolerError(
            f"the session URL {direct.redacted_url} is a pooled URL (?pooler=transaction): "
            f"the executor session's lock, LISTEN and migrations need a session of their "
            f"own: give the server's direct URL (not the pooler's); see docs/pooled-urls.md"
        )
    return direct
