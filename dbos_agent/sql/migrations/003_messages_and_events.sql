-- dbos_agent schema, version 3: durable messages into workflows and events out of them.
--
-- A message is consumed by marking it with the step position of the recv
-- that took it, in the same statement that records that step (see
-- receive_message in queries.sql): it is never deleted, so an idempotency key
-- keeps deduplicating after the message was consumed, and the log and the
-- mailbox can always be reconciled. Inserting a message or setting an event
-- NOTIFYs (in the inserting transaction, by trigger) so that waiters wake at
-- once, whoever wrote the row; waiters also poll, so a lost notification
-- only delays them.

CREATE TABLE dbos_agent.messages (
    message_id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination_id  text        NOT NULL,
    -- '' is the default topic (topic=None).
    topic           text        NOT NULL DEFAULT '',
    message         jsonb       NOT NULL,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- The position of the destination's recv step that consumed it.
    consumed_seq    integer     CHECK (consumed_seq >= 0),
    consumed_at     timestamptz,
    CONSTRAINT messages_consumed_together CHECK ((consumed_seq IS NULL) = (consumed_at IS NULL)),
    -- Same key, same destination: one message. NULL keys never collide.
    CONSTRAINT messages_idempotency_key UNIQUE (destination_id, idempotency_key)
);
-- recv: the oldest unconsumed message of (workflow, topic).
CREATE INDEX messages_unconsumed
    ON dbos_agent.messages (destination_id, topic, message_id)
    WHERE consumed_seq IS NULL;

-- Events published by a workflow: the last value per key wins.
CREATE TABLE dbos_agent.events (
    workflow_id text        NOT NULL,
    key         text        NOT NULL,
    value       jsonb       NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, key)
);

-- The payload is the workflow id; an id too long for a NOTIFY payload sends
-- '' instead, which wakes every waiter on the channel.
CREATE FUNCTION dbos_agent.notify_message() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dbos_agent_messages',
                      CASE WHEN octet_length(NEW.destination_id) < 7000
                           THEN NEW.destination_id ELSE '' END);
    RETURN NULL;
END
$$;

CREATE FUNCTION dbos_agent.notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dbos_agent_events',
                      CASE WHEN octet_length(NEW.workflow_id) < 7000
                           THEN NEW.workflow_id ELSE '' END);
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_notify AFTER INSERT ON dbos_agent.messages
    FOR EACH ROW EXECUTE FUNCTION dbos_agent.notify_message();
CREATE TRIGGER events_notify AFTER INSERT OR UPDATE ON dbos_agent.events
    FOR EACH ROW EXECUTE FUNCTION dbos_agent.notify_event();
