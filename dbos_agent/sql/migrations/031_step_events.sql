-- dbos_agent schema, version 31: the events a step set, recorded with it.
--
-- da.set_event inside a step is no step of its own: the event is set in the
-- transaction that checkpoints the step. The step's row records what it set,
-- {"key": value, ...} (the last value of each key; NULL: none), written by the same
-- statement as the row (record_step), so that a fork after the step copies the event
-- and a rewind before it takes the event back, as for a body's set_event step. Only a
-- success sets events.

ALTER TABLE dbos_agent.steps
    ADD COLUMN events jsonb,
    ADD CONSTRAINT steps_events_of_a_success CHECK (
        events IS NULL OR (status = 'SUCCESS' AND jsonb_typeof(events) = 'object')
    );

-- The events a workflow set below step `before`, one row per setter and key (seq: the
-- setter's position, for the caller to order by): its body's set_event steps (value NULL in logs of older versions,
-- without the value in the step's inputs: not known) and the events its steps set
-- (their `events`). The last setter of a key below a position is what the event held
-- there: a fork copies it, a rewind restores it.
CREATE FUNCTION dbos_agent.event_sets(wid text, before integer)
RETURNS TABLE (seq integer, key text, value jsonb)
LANGUAGE sql STABLE AS $$
    SELECT s.seq, s.inputs ->> 'key',
           CASE WHEN s.inputs ? 'value' THEN s.inputs -> 'value' END
    FROM dbos_agent.steps AS s
    WHERE s.workflow_id = wid AND s.seq < before
      AND s.name = 'dbos_agent.set_event' AND s.status = 'SUCCESS'
      AND s.inputs ->> 'key' IS NOT NULL
    UNION ALL
    SELECT s.seq, e.key, e.value
    FROM dbos_agent.steps AS s, jsonb_each(s.events) AS e
    WHERE s.workflow_id = wid AND s.seq < before AND s.events IS NOT NULL
$$;
