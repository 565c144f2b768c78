-- dbos_agent schema, version 20: a running total of model usage per workflow family.
--
-- A model budget (agent/budget.py) is checked before every live model call against
-- what the workflow's family spent: its root ancestor (up parent_id) and every workflow
-- started below it. Summing the family's step log on each call grew with the square of
-- a long agent's turns. Instead, each step recorded SUCCESS whose output carries a
-- "usage" object (a model reply) adds itself to its family's row here, by trigger, in
-- the statement that records the step: an insert, or an intent becoming SUCCESS (an
-- ON CONFLICT update, a recv filled by a wake, an in-doubt step resolved). A fork copies
-- its original's steps into its own log, and an import inserts a log, so both count
-- through the same trigger. The read (get_family_model_usage) then sums a few rows.
--
-- Rows are per root, step name and model: the step names that are model calls are
-- known only to the process (MODEL_STEP_NAMES), which picks its own at the read; the
-- model prices the tokens. workflow_id is the family's root (the key is a workflow id,
-- like every table's that belongs to a workflow): retention deletes a family's row with
-- its root. Tokens follow agent/accounting.py's usage_of_reply: a number is counted
-- (truncated, as int() does), anything else is 0.

CREATE TABLE dbos_agent.family_usage (
    workflow_id                 text   NOT NULL,
    step_name                   text   NOT NULL,
    model                       text   NOT NULL,
    replies                     bigint NOT NULL,
    input_tokens                bigint NOT NULL,
    output_tokens               bigint NOT NULL,
    cache_creation_input_tokens bigint NOT NULL,
    cache_read_input_tokens     bigint NOT NULL,
    PRIMARY KEY (workflow_id, step_name, model)
);

-- The root of a workflow's family: its topmost ancestor still recorded (itself without a
-- parent; NULL for an unknown id). A loop of primary-key lookups, planned once per
-- session: the trigger below runs it for every model reply.
CREATE FUNCTION dbos_agent.family_root(id text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    root text;
    parent text;
    next_root text;
    next_parent text;
BEGIN
    SELECT w.workflow_id, w.parent_id INTO root, parent
    FROM dbos_agent.workflows AS w WHERE w.workflow_id = id;
    FOR depth IN 1..1000 LOOP
        EXIT WHEN parent IS NULL;
        SELECT w.workflow_id, w.parent_id INTO next_root, next_parent
        FROM dbos_agent.workflows AS w WHERE w.workflow_id = parent;
        EXIT WHEN NOT FOUND;
        root := next_root;
        parent := next_parent;
    END LOOP;
    RETURN root;
END
$$;

-- One token count of a reply's usage object, as usage_of_reply reads it; clamped, so that
-- a reply with an absurd count can never fail the checkpoint that records it.
CREATE FUNCTION dbos_agent.usage_tokens(usage jsonb, key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE jsonb_typeof(usage -> key)
               WHEN 'number' THEN least(greatest(trunc((usage ->> key)::numeric),
                                                 -1e18), 1e18)::bigint
               WHEN 'boolean' THEN (usage ->> key)::boolean::integer
               ELSE 0
           END
$$;

CREATE FUNCTION dbos_agent.count_family_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dbos_agent.family_usage AS f
        (workflow_id, step_name, model, replies, input_tokens, output_tokens,
         cache_creation_input_tokens, cache_read_input_tokens)
    VALUES (coalesce(dbos_agent.family_root(NEW.workflow_id), NEW.workflow_id), NEW.name,
            coalesce(nullif(NEW.output ->> 'model', ''), 'unknown'), 1,
            dbos_agent.usage_tokens(NEW.output -> 'usage', 'input_tokens'),
            dbos_agent.usage_tokens(NEW.output -> 'usage', 'output_tokens'),
            dbos_agent.usage_tokens(NEW.output -> 'usage', 'cache_creation_input_tokens'),
            dbos_agent.usage_tokens(NEW.output -> 'usage', 'cache_read_input_tokens'))
    ON CONFLICT (workflow_id, step_name, model) DO UPDATE
        SET replies = f.replies + 1,
            input_tokens = f.input_tokens + EXCLUDED.input_tokens,
            output_tokens = f.output_tokens + EXCLUDED.output_tokens,
            cache_creation_input_tokens
                = f.cache_creation_input_tokens + EXCLUDED.cache_creation_input_tokens,
            cache_read_input_tokens
                = f.cache_read_input_tokens + EXCLUDED.cache_read_input_tokens;
    RETURN NULL;
END
$$;

-- The WHEN clauses keep every other step (no usage object, or not a success) from
-- running the function at all.
CREATE TRIGGER steps_count_family_usage AFTER INSERT ON dbos_agent.steps
    FOR EACH ROW
    WHEN (NEW.status = 'SUCCESS' AND jsonb_typeof(NEW.output -> 'usage') = 'object')
    EXECUTE FUNCTION dbos_agent.count_family_usage();
CREATE TRIGGER steps_count_family_usage_on_success AFTER UPDATE OF status ON dbos_agent.steps
    FOR EACH ROW
    WHEN (OLD.status <> 'SUCCESS' AND NEW.status = 'SUCCESS'
          AND jsonb_typeof(NEW.output -> 'usage') = 'object')
    EXECUTE FUNCTION dbos_agent.count_family_usage();

-- The logs recorded before this version, once: per workflow, then per family.
WITH used AS (
    SELECT s.workflow_id, s.name,
           coalesce(nullif(s.output ->> 'model', ''), 'unknown') AS model,
           count(*) AS replies,
           sum(dbos_agent.usage_tokens(s.output -> 'usage', 'input_tokens')) AS i,
           sum(dbos_agent.usage_tokens(s.output -> 'usage', 'output_tokens')) AS o,
           sum(dbos_agent.usage_tokens(s.output -> 'usage', 'cache_creation_input_tokens'))
               AS cw,
           sum(dbos_agent.usage_tokens(s.output -> 'usage', 'cache_read_input_tokens')) AS cr
    FROM dbos_agent.steps AS s
    WHERE s.status = 'SUCCESS' AND jsonb_typeof(s.output -> 'usage') = 'object'
    GROUP BY s.workflow_id, s.name, 3
)
INSERT INTO dbos_agent.family_usage
    (workflow_id, step_name, model, replies, input_tokens, output_tokens,
     cache_creation_input_tokens, cache_read_input_tokens)
SELECT coalesce(dbos_agent.family_root(u.workflow_id), u.workflow_id), u.name, u.model,
       sum(u.replies), least(sum(u.i), 1e18), least(sum(u.o), 1e18), least(sum(u.cw), 1e18),
       least(sum(u.cr), 1e18)
FROM used AS u
GROUP BY 1, 2, 3;
