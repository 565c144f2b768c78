-- dbos_agent schema, version 8: suspended workflows.
--
-- A background workflow whose durable wait (sleep, recv, get_event) cannot be
-- met at once is SUSPENDED instead of holding a thread: its run ends, it belongs
-- to no session (owner_key NULL), and the row says what would wake it:
--
--   wait_kind 'sleep': wake_at (database clock) has come;
--   wait_kind 'recv':  a message to the workflow on topic wait_name, or wake_at
--                      (the recv's deadline, NULL for none) has come;
--   wait_kind 'event': workflow wait_target has published event wait_name, or
--                      wake_at has come.
--
-- Any live executor that knows the workflow's function (and runs its
-- application version) may wake it: one guarded statement makes it PENDING and
-- owned by that session, which re-runs it from its log. Recovery never claims a
-- SUSPENDED workflow, so a process starting beside 100,000 of them replays only
-- those whose condition holds.

ALTER TABLE dbos_agent.workflows
    DROP CONSTRAINT workflows_status_check,
    ADD CONSTRAINT workflows_status_check CHECK (status IN (
        'PENDING', 'SUSPENDED', 'SUCCESS', 'ERROR', 'CANCELLED', 'ENQUEUED',
        'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'IN_DOUBT')),
    DROP CONSTRAINT workflows_outcome_matches_status,
    ADD CONSTRAINT workflows_outcome_matches_status CHECK (
        (status = 'SUCCESS' AND error IS NULL AND finished_at IS NOT NULL)
        OR (status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'IN_DOUBT')
            AND output IS NULL)
        OR (status IN ('PENDING', 'ENQUEUED', 'SUSPENDED') AND output IS NULL AND error IS NULL)
    ),
    ADD COLUMN wait_kind text CHECK (wait_kind IN ('sleep', 'recv', 'event')),
    ADD COLUMN wait_target text,
    ADD COLUMN wait_name text,
    ADD COLUMN wake_at timestamptz,
    ADD CONSTRAINT workflows_suspended_waits CHECK (
        (status = 'SUSPENDED') = (wait_kind IS NOT NULL)
        AND (wait_kind IS DISTINCT FROM 'sleep' OR wake_at IS NOT NULL)
        AND (wait_kind NOT IN ('recv', 'event') OR wait_name IS NOT NULL)
        AND (wait_kind IS DISTINCT FROM 'event' OR wait_target IS NOT NULL)
    );

-- Due timers, earliest first.
CREATE INDEX workflows_suspended_until
    ON dbos_agent.workflows (wake_at) WHERE status = 'SUSPENDED';
-- Who waits on a workflow: its events (a NOTIFY names the publisher).
CREATE INDEX workflows_suspended_on
    ON dbos_agent.workflows (wait_kind, wait_target) WHERE status = 'SUSPENDED';
