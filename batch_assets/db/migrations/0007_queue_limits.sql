-- 0007: limits that hold across every worker process on every host (CONTRACT §10, issue 18).
-- Idempotent (IF NOT EXISTS, CREATE OR REPLACE).

-- rate_limit_per_s: one row per queue holding the next free call slot (the theoretical arrival time of
-- the generic cell rate algorithm). A worker reserves a run of slots 1/rate apart with `ba_rate_take`
-- and calls at those times, so two calls of a queue are never closer than 1/rate, whichever worker
-- makes them; slots are handed out at most `horizon` seconds ahead of now.
CREATE TABLE IF NOT EXISTS ba_queue_rate (
    queue       text PRIMARY KEY,
    next_slot   timestamptz NOT NULL DEFAULT '-infinity',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- ba_rate_take(queue, want, min, rate, horizon_s) -> (granted, first_in_s)
--   granted     slots reserved: 0, or between least(min, want) and want
--   first_in_s  granted > 0: seconds from now (the server's clock) until the first slot; the others
--               follow 1/rate apart. granted = 0: seconds until least(min, want) slots fit; ask then.
-- clock_timestamp() is read after the row lock, so a worker that waited for the lock reserves from
-- the time it got it. An idle queue accumulates no burst: the next slot is never before now.
CREATE OR REPLACE FUNCTION ba_rate_take(p_queue text, p_want int, p_min int, p_rate float8, p_horizon_s float8,
                                        OUT granted int, OUT first_in_s float8)
LANGUAGE plpgsql AS $$
DECLARE
    v_next  timestamptz;
    v_now   timestamptz;
    v_start timestamptz;
    v_ahead float8;
    v_least int := greatest(least(p_min, p_want), 1);
BEGIN
    SELECT next_slot INTO v_next FROM ba_queue_rate WHERE queue = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO ba_queue_rate (queue) VALUES (p_queue) ON CONFLICT (queue) DO NOTHING;
        SELECT next_slot INTO v_next FROM ba_queue_rate WHERE queue = p_queue FOR UPDATE;
    END IF;
    v_now := clock_timestamp();
    v_start := greatest(v_next, v_now);
    v_ahead := extract(epoch FROM v_start - v_now);
    granted := least(p_want, greatest(floor(least((p_horizon_s - v_ahead) * p_rate, 1e6) + 1e-9), 0)::int);
    IF granted < v_least THEN
        granted := 0;
        first_in_s := v_ahead - p_horizon_s + v_least / p_rate;
        RETURN;
    END IF;
    UPDATE ba_queue_rate
       SET next_slot = v_start + make_interval(secs => granted / p_rate), updated_at = v_now
     WHERE queue = p_queue;
    first_in_s := v_ahead;
END
$$;

-- max_in_flight: slot k of a queue is held by one worker run (`holder`) while a call is in flight, under a
-- lease the worker renews; a dead worker's slots come back once their lease passed. Slots 0..max-1 are
-- inserted by the first worker that uses them.
CREATE TABLE IF NOT EXISTS ba_queue_slots (
    queue       text NOT NULL,
    slot        int NOT NULL,
    holder      uuid NULL,
    lease_until timestamptz NULL,
    PRIMARY KEY (queue, slot)
);
