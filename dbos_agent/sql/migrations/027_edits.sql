-- dbos_agent schema, version 27: what operators changed in a workflow's log.
--
-- A rewind (the workflow runs again in place from a step, its later steps deleted) and a
-- fork whose inputs or recorded step outputs were edited are recorded on the workflow
-- they changed or made, oldest first: a JSON array of {"kind": "rewind" | "inputs" |
-- "output", "by", "at", ...} (see rewind_workflow and fork_workflow in queries.sql).
-- NULL: never edited. A replay reads none of it: it is the account operators read in
-- `workflows show`, the API and the dashboard.

ALTER TABLE dbos_agent.workflows ADD COLUMN edits jsonb;

-- The stream items a workflow's body wrote below step `before`: its write_stream and
-- close_stream steps record the item's offset, and their inputs its key (an older log
-- has no key there: matched on any key). A fork copies them; a rewind keeps them.
CREATE FUNCTION dbos_agent.body_stream_writes(wid text, before integer)
RETURNS TABLE (seq integer, key text, "offset" integer)
LANGUAGE sql STABLE AS $$
    SELECT k.seq, i.key, i."offset"
    FROM dbos_agent.steps AS k
    JOIN dbos_agent.streams AS i
      ON i.workflow_id = wid AND i.step_seq IS NULL
     AND jsonb_typeof(k.output) = 'number'
     AND i."offset" = (k.output #>> '{}')::integer
     AND i.kind = CASE k.name WHEN 'dbos_agent.close_stream' THEN 'close' ELSE 'value' END
     AND (k.inputs ->> 'key' IS NULL OR i.key = k.inputs ->> 'key')
    WHERE k.workflow_id = wid AND k.seq < before
      AND k.name IN ('dbos_agent.write_stream', 'dbos_agent.close_stream')
      AND k.status = 'SUCCESS'
$$;
