-- dbos_agent schema, version 4: where a forked workflow came from.
--
-- `fork` copies a workflow's recorded steps below N into a new workflow that
-- runs live from N. The origin is kept so that operators (and `workflows
-- show`) can tell a fork from an original and trace a rerun back to the run
-- it fixed. No foreign key: an original may be deleted by retention later.

ALTER TABLE dbos_agent.workflows ADD COLUMN forked_from text;
ALTER TABLE dbos_agent.workflows ADD COLUMN forked_from_step integer
    CHECK (forked_from_step >= 0);
ALTER TABLE dbos_agent.workflows ADD CONSTRAINT workflows_fork_origin_complete
    CHECK ((forked_from IS NULL) = (forked_from_step IS NULL));
