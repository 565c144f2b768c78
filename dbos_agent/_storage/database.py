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
"""

from __future__ import annotations

from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES
from . import migrations
from .approvals import ApprovalStore
from .connector import Connector
from .histories import HistoryStore
from .inspection import InspectionStore
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
    """A pool of connections to the system database and the stores that use it."""

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
        self.workflows = WorkflowStore(self)
        self.steps = StepStore(self)
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

    def migrate(self) -> int:
        """Apply the missing migrations; returns the schema version now in force."""
        return migrations.migrate(self)

    def schema_version(self) -> int:
        """The newest migration applied (0 before the first :meth:`migrate`)."""
        return migrations.schema_version(self)
