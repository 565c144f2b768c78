-- dbos_agent schema, version 26: a workflow's inputs are kept as the caller wrote them.
--
-- jsonb orders an object's keys its own way (shorter first), so a workflow dequeued,
-- recovered or started by a Client got a dict argument with its keys reordered, where a
-- direct call in the process kept the caller's order: json.dumps of one argument gave two
-- strings. json keeps the text (no statement compares inputs or reads into them).

ALTER TABLE dbos_agent.workflows ALTER COLUMN inputs TYPE json USING inputs::json;
