-- dbos_agent schema, version 10: a workflow waiting for another's result suspends.
--
-- wait_kind 'child': the SUSPENDED workflow waits for workflow wait_target to
-- finish (handle.result() in a background run). When a workflow finishes while
-- someone is suspended on it, the notify_finished trigger sends its id on the
-- channel dbos_agent_finished, and the waker of any process wakes the waiter.
-- (A finish racing the waiter's suspension is caught by the waker's sweep.)

ALTER TABLE dbos_agent.workflows
    DROP CONSTRAINT workflows_wait_kind_check,
    ADD CONSTRAINT workflows_wait_kind_check
        CHECK (wait_kind IN ('sleep', 'recv', 'event', 'child')),
    DROP CONSTRAINT workflows_suspended_waits,
    ADD CONSTRAINT workflows_suspended_waits CHECK (
        (status = 'SUSPENDED') = (wait_kind IS NOT NULL)
        AND (wait_kind IS DISTINCT FROM 'sleep' OR wake_at IS NOT NULL)
        AND (wait_kind NOT IN ('recv', 'event') OR wait_name IS NOT NULL)
        AND (wait_kind NOT IN ('event', 'child') OR wait_target IS NOT NULL)
    );

CREATE FUNCTION dbos_agent.notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM dbos_agent.workflows
               WHERE status = 'SUSPENDED' AND wait_kind = 'child'
                 AND wait_target = NEW.workflow_id) THEN
        PERFORM pg_notify('dbos_agent_finished',
                          CASE WHEN octet_length(NEW.workflow_id) < 7000
                               THEN NEW.workflow_id ELSE '' END);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER workflows_notify_finished AFTER UPDATE OF status ON dbos_agent.workflows
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('PENDING', 'ENQUEUED', 'SUSPENDED')
          AND OLD.status IN ('PENDING', 'ENQUEUED', 'SUSPENDED'))
    EXECUTE FUNCTION dbos_agent.notify_finished();
