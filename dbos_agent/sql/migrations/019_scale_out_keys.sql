-- dbos_agent schema, version 19: every table of a workflow is keyed by its workflow id.
--
-- A message belongs to the workflow it is sent to: its primary key becomes
-- (destination_id, message_id), as steps, events, streams and approvals are keyed by
-- (workflow_id, ...). Nothing changes for the statements (message_id is still handed
-- out by the identity and orders a mailbox); the key is what a database distributed
-- by workflow id (Citus) needs: a primary key or unique constraint must contain the
-- distribution column, so that each is enforced within one shard (docs/scale-out.md).

ALTER TABLE dbos_agent.messages DROP CONSTRAINT messages_pkey;
ALTER TABLE dbos_agent.messages
    ADD CONSTRAINT messages_pkey PRIMARY KEY (destination_id, message_id);
