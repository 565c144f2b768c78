-- dbos_agent schema, version 32: one place that knows what hangs off a workflow.
--
-- Deleting workflows (retention's batches, `dbos-agent workflows delete`) deletes with
-- them their log: steps, the messages sent to them, events, stream items, approval
-- requests and the model usage of the families they were the roots of. Both statements
-- call this function, so a table added to the log is added here once.
CREATE FUNCTION dbos_agent.delete_logs(ids text[])
RETURNS TABLE (steps bigint, messages bigint, events bigint)
LANGUAGE sql VOLATILE AS $$
    WITH steps AS (
        DELETE FROM dbos_agent.steps WHERE workflow_id = ANY(ids) RETURNING 1
    ), messages AS (
        DELETE FROM dbos_agent.messages WHERE destination_id = ANY(ids) RETURNING 1
    ), events AS (
        DELETE FROM dbos_agent.events WHERE workflow_id = ANY(ids) RETURNING 1
    ), streams AS (
        DELETE FROM dbos_agent.streams WHERE workflow_id = ANY(ids)
    ), approvals AS (
        DELETE FROM dbos_agent.approvals WHERE workflow_id = ANY(ids)
    ), usage AS (
        DELETE FROM dbos_agent.family_usage WHERE workflow_id = ANY(ids)
    )
    SELECT (SELECT count(*) FROM steps), (SELECT count(*) FROM messages),
           (SELECT count(*) FROM events)
$$;
