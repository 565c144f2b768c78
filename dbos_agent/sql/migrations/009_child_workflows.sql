-- dbos_agent schema, version 9: child workflows know their parent.
--
-- A workflow started from inside another (da.start in a workflow or its steps)
-- records the parent's id, so that cancelling a workflow cancels the workflows
-- it started, and theirs (cancel_workflow walks the tree in one statement).
-- No foreign key: retention may delete a parent before its children.

ALTER TABLE dbos_agent.workflows ADD COLUMN parent_id text;

CREATE INDEX workflows_children
    ON dbos_agent.workflows (parent_id) WHERE parent_id IS NOT NULL;
