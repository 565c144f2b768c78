-- dbos_agent schema, version 11: a workflow may be started with a deadline.
--
-- deadline_at (on the database clock) is set once, when the workflow is first
-- recorded (da.workflow_timeout); a restart, a recovery or a wake-up keeps it.
-- A workflow still unfinished at its deadline is cancelled with the workflows it
-- started (cancel_overdue_workflows, run by every waking process's waker).

ALTER TABLE dbos_agent.workflows ADD COLUMN deadline_at timestamptz;

CREATE INDEX workflows_deadlines ON dbos_agent.workflows (deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('PENDING', 'SUSPENDED', 'ENQUEUED');
