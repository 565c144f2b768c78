-- dbos_agent schema, version 5: the ownership guard of every log write, as one function.

-- The status a session may write under: the workflow's status, or NOT_OWNER
-- when it is PENDING under another session (NULL when there is no such
-- workflow). Every statement that appends to the log guards on it.
CREATE FUNCTION dbos_agent.write_status(wid text, session integer) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN owner_key IS DISTINCT FROM session AND status = 'PENDING'
                THEN 'NOT_OWNER' ELSE status END
    FROM dbos_agent.workflows
    WHERE workflow_id = wid
$$;
