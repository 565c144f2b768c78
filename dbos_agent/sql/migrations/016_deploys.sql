-- dbos_agent schema, version 16: workflows outlive deploys and processes.
--
-- Every launched process takes over the workflows of dead sessions (not only the
-- worker daemon). A workflow that becomes PENDING without an owner (resumed or
-- forked by a process that cannot run it, an in-doubt step resolved from the CLI)
-- or DIVERGED (below), and a session that ends leaving PENDING workflows, say so on
-- the channel dbos_agent_claimable, so that a live process takes them at once
-- instead of at its next look.

CREATE FUNCTION dbos_agent.notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dbos_agent_claimable', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER workflows_notify_claimable AFTER INSERT OR UPDATE OF status, owner_key
    ON dbos_agent.workflows
    FOR EACH ROW
    WHEN ((NEW.status = 'PENDING' AND NEW.owner_key IS NULL) OR NEW.status = 'DIVERGED')
    EXECUTE FUNCTION dbos_agent.notify_claimable();

CREATE TRIGGER executors_notify_claimable AFTER UPDATE OF heartbeat_at
    ON dbos_agent.executors
    FOR EACH ROW WHEN (NEW.heartbeat_at = '-infinity' AND OLD.heartbeat_at <> '-infinity')
    EXECUTE FUNCTION dbos_agent.notify_claimable();

-- A code change must never fail a workflow. When the code calls another step than
-- the log recorded at a position, the workflow is DIVERGED: unfinished, owned by
-- nobody, with what diverged (`diverged`: position, recorded and called names, the
-- code's versions) and the versions of code that diverged on it (`diverged_versions`:
-- those processes leave it alone). A process whose code is not among them takes it
-- and continues it (a fixed deploy, an old version still running).
-- `accepted_versions`: application versions other than its own whose processes may
-- run it, recorded by `dbos-agent check-deploy --adopt` once it was checked to fit.
ALTER TABLE dbos_agent.workflows
    ADD COLUMN diverged          jsonb,
    ADD COLUMN diverged_versions text[] NOT NULL DEFAULT '{}',
    ADD COLUMN accepted_versions text[] NOT NULL DEFAULT '{}',
    DROP CONSTRAINT workflows_status_check,
    ADD CONSTRAINT workflows_status_check CHECK (status IN (
        'PENDING', 'SUSPENDED', 'SUCCESS', 'ERROR', 'CANCELLED', 'ENQUEUED',
        'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'IN_DOUBT', 'DIVERGED')),
    DROP CONSTRAINT workflows_outcome_matches_status,
    ADD CONSTRAINT workflows_outcome_matches_status CHECK (
        (status = 'SUCCESS' AND error IS NULL AND finished_at IS NOT NULL)
        OR (status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED', 'IN_DOUBT')
            AND output IS NULL)
        OR (status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')
            AND output IS NULL AND error IS NULL)
    ),
    ADD CONSTRAINT workflows_diverged_says_why
        CHECK (status <> 'DIVERGED' OR diverged IS NOT NULL);

CREATE INDEX workflows_diverged ON dbos_agent.workflows (created_at)
    WHERE status = 'DIVERGED';

DROP INDEX dbos_agent.workflows_deadlines;
CREATE INDEX workflows_deadlines ON dbos_agent.workflows (deadline_at)
    WHERE deadline_at IS NOT NULL AND status IN ('PENDING', 'SUSPENDED', 'ENQUEUED', 'DIVERGED');

DROP TRIGGER workflows_notify_finished ON dbos_agent.workflows;
CREATE TRIGGER workflows_notify_finished AFTER UPDATE OF status ON dbos_agent.workflows
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED')
          AND OLD.status IN ('PENDING', 'ENQUEUED', 'SUSPENDED', 'DIVERGED'))
    EXECUTE FUNCTION dbos_agent.notify_finished();

-- Whether a process may run a workflow: its application version is the workflow's
-- (or one accepted for it), or it runs every version (NULL); and its code has not
-- diverged on it. Every statement that gives a workflow to a process asks this.
CREATE FUNCTION dbos_agent.may_run(
    workflow_version text, accepted text[], diverged text[],
    process_version text, process_code text
) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT (process_version IS NULL OR workflow_version = process_version
            OR process_version = ANY(accepted))
           AND NOT coalesce(process_code = ANY(diverged), false)
$$;
