-- dbos_agent schema, version 13: durable streams.
--
-- A workflow publishes ordered JSON values under a key (da.write_stream); readers
-- anywhere follow them by offset. One row per item, offsets dense from 0 per
-- (workflow, key). A value written from the workflow body is checkpointed with a
-- step (exactly once); one written from inside a step goes out live, tagged with the
-- step's position and attempt: when a later attempt of that step writes, or an
-- attempt fails, a 'reset' item tells readers to drop that step's earlier items.
-- A 'close' item ends the stream; nothing may follow it.

CREATE TABLE dbos_agent.streams (
    workflow_id text        NOT NULL,
    key         text        NOT NULL,
    "offset"    integer     NOT NULL CHECK ("offset" >= 0),
    kind        text        NOT NULL CHECK (kind IN ('value', 'reset', 'close')),
    value       jsonb,
    step_seq    integer,
    attempt     integer,
    attempt_id  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, key, "offset"),
    CONSTRAINT streams_value_only_on_values CHECK ((kind = 'value') = (value IS NOT NULL))
);

-- Append one item at the next offset and NOTIFY readers (payload: the workflow id).
-- Returns the offset, -1 when the stream is closed, or -2 when a step's item comes
-- from a session that no longer owns the PENDING workflow (a process paused past
-- its lease: its output is void, and nothing is written). The
-- first value of a step attempt after items of another attempt of that step (a
-- retry, a re-run after a crash) is preceded by a reset naming the step. Offsets
-- come from the primary key: a writer that loses a race takes the next one, after
-- the winner commits, so readers never see a later offset before an earlier one.
CREATE FUNCTION dbos_agent.append_stream(
    wid text, skey text, item_kind text, item jsonb,
    seq integer, attempt_no integer, attempt_tag text, session integer
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    next_offset integer;
BEGIN
    IF seq IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM dbos_agent.workflows
        WHERE workflow_id = wid AND status = 'PENDING' AND owner_key = session) THEN
        RETURN -2;
    END IF;
    IF EXISTS (SELECT 1 FROM dbos_agent.streams
               WHERE workflow_id = wid AND key = skey AND kind = 'close') THEN
        RETURN -1;
    END IF;
    IF item_kind = 'value' AND seq IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM dbos_agent.streams
                       WHERE workflow_id = wid AND key = skey AND step_seq = seq
                         AND attempt_id = attempt_tag)
       AND EXISTS (SELECT 1 FROM dbos_agent.streams AS s
                   WHERE s.workflow_id = wid AND s.key = skey AND s.step_seq = seq
                     AND s.kind = 'value'
                     AND s."offset" > COALESCE(
                         (SELECT max(r."offset") FROM dbos_agent.streams AS r
                          WHERE r.workflow_id = wid AND r.key = skey AND r.step_seq = seq
                            AND r.kind = 'reset'), -1)) THEN
        PERFORM dbos_agent.append_stream(wid, skey, 'reset', NULL, seq, attempt_no, attempt_tag,
                                         session);
    END IF;
    LOOP
        SELECT COALESCE(max("offset") + 1, 0) INTO next_offset
        FROM dbos_agent.streams WHERE workflow_id = wid AND key = skey;
        BEGIN
            INSERT INTO dbos_agent.streams
                (workflow_id, key, "offset", kind, value, step_seq, attempt, attempt_id)
            VALUES (wid, skey, next_offset, item_kind, item, seq, attempt_no, attempt_tag);
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            -- another writer took this offset (and has committed): take the next
        END;
    END LOOP;
    PERFORM pg_notify('dbos_agent_streams',
                      CASE WHEN octet_length(wid) < 7000 THEN wid ELSE '' END);
    RETURN next_offset;
END
$$;
