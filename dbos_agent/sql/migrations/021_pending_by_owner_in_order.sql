-- dbos_agent schema, version 21: the PENDING workflows of one session, in order.
--
-- A take-over (claim_workflows, probe_orphans) reads the PENDING workflows of the dead
-- sessions, oldest first, from this index: each dead session's first page, so that the
-- PENDING workflows of live sessions, however many, are not walked. Before, the index
-- held the owner alone, and the statements tested "the owner is among the dead" on
-- every PENDING row: a planner that cannot know the dead own few walked them all in
-- created_at order. The owner NULL (PENDING and owned by nobody) is in it too.

DROP INDEX dbos_agent.workflows_pending_by_owner;
CREATE INDEX workflows_pending_by_owner
    ON dbos_agent.workflows (owner_key, created_at, workflow_id) WHERE status = 'PENDING';
