-- dbos_agent schema, version 16: workflows outlive deploys and processes.
--
-- Every launched process takes over the workflows of dead sessions (not only the
-- worker daemon). A workflow that becomes PENDING without an owner (resumed or
-- forked by a process that cannot run it, an in-doubt step resolved from the CLI)
-- and a session that ends leaving PENDING workflows say so on the channel
-- dbos_agent_claimable, so that a live process takes them at once instead of at
-- its next look.

CREATE FUNCTION dbos_agent.notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dbos_agent_claimable', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER workflows_notify_claimable AFTER INSERT OR UPDATE OF status, owner_key
    ON dbos_agent.workflows
    FOR EACH ROW WHEN (NEW.status = 'PENDING' AND NEW.owner_key IS NULL)
    EXECUTE FUNCTION dbos_agent.notify_claimable();

CREATE TRIGGER executors_notify_claimable AFTER UPDATE OF heartbeat_at
    ON dbos_agent.executors
    FOR EACH ROW WHEN (NEW.heartbeat_at = '-infinity' AND OLD.heartbeat_at <> '-infinity')
    EXECUTE FUNCTION dbos_agent.notify_claimable();
