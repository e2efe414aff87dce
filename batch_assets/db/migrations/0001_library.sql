-- 0001_library: the library's own objects. Every table and function is named ba_*, so the library lives in a
-- team's database beside tables of its own (even ones named customers, payments or outbox_events) and touches
-- none of them. Forward-only and idempotent: each statement is guarded, so running the file again changes
-- nothing, and on a database of the previous release (which made most of these objects under its one combined
-- set, recorded in ba_schema_versions) it adds only what is missing, without rewriting a table or an index.

-- The ledger: one row per file applied, per migration set (the library's is `batch_assets`).
CREATE TABLE IF NOT EXISTS ba_migrations (
    migration_set text NOT NULL,
    version       int NOT NULL,
    name          text NOT NULL,
    applied_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (migration_set, version)
);

-- The job lock (PostgreSQL backend): expiring, compare-and-extend, compare-and-delete.
-- lock_until is lock-at-most-for (renewed each heartbeat); min_until = locked_at +
-- lock-at-least-for, kept on release so a very short run still blocks the next one.
CREATE TABLE IF NOT EXISTS ba_job_locks (
    name        text PRIMARY KEY,
    owner       text NOT NULL,
    locked_at   timestamptz NOT NULL DEFAULT now(),
    lock_until  timestamptz NOT NULL,
    min_until   timestamptz NOT NULL DEFAULT now()
);

-- Durable, owner-fenced run leases.
CREATE TABLE IF NOT EXISTS ba_leases (
    name         text PRIMARY KEY,
    owner        text NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- Low-watermark checkpoints, one per (sweep, mode, range). The plan of a sweep run registers every cursor range
-- of the run under one generation id, so a range that finished stays finished (DONE within its generation) until
-- every range of the generation has finished; only then does the next run of that mode start over. generation is
-- nullable: checkpoints saved by a run without a plan (the engine used on its own) have none.
CREATE TABLE IF NOT EXISTS ba_checkpoints (
    sweep             text NOT NULL,
    mode              text NOT NULL,
    range_key         text NOT NULL DEFAULT 'all',
    cursor            jsonb NULL,
    rules_fingerprint text NULL,
    run_id            text NULL,
    run_date          date NULL,
    status            text NOT NULL DEFAULT 'RUNNING',
    counters          jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    generation        text NULL,
    PRIMARY KEY (sweep, mode, range_key)
);
-- A database of the previous release made before checkpoint generations has the table without the column. The
-- catalog is read first: ALTER TABLE takes an ACCESS EXCLUSIVE lock even when the column is there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'ba_checkpoints'::regclass
                                              AND attname = 'generation' AND NOT attisdropped) THEN
        ALTER TABLE ba_checkpoints ADD COLUMN generation text NULL;
    END IF;
END
$$;

-- One row per finished job run, with its summary.
CREATE TABLE IF NOT EXISTS ba_run_history (
    id          bigserial PRIMARY KEY,
    run_id      text NOT NULL,
    job         text NOT NULL,
    mode        text NULL,
    run_date    date NULL,
    status      text NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    summary     jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS ba_run_history_job_idx ON ba_run_history (job, finished_at);

-- What workers last recorded about each queue: the outage breaker's state (for `queue stats` and Dagster) and
-- who recorded it. One row per queue name.
CREATE TABLE IF NOT EXISTS ba_queue_state (
    queue             text PRIMARY KEY,
    breaker           text NOT NULL DEFAULT 'closed',
    breaker_since     timestamptz NOT NULL DEFAULT now(),
    cooldown_s        double precision NULL,
    failures_in_row   int NOT NULL DEFAULT 0,
    recorded_by       text NULL,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ba_queue_state_breaker_check CHECK (breaker IN ('closed', 'open', 'half_open'))
);

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

-- The outbox of declared sweeps whose project has no outbox of its own: one event per changed row, relayed to
-- the sink with its id as idempotency key. The shape and claim columns of the reference project's outbox_events.
-- claimed_by / claimed_until: a relay owns the rows it claimed until claimed_until; SENT is fenced on claimed_by.
-- fillfactor 50 leaves half of each page free, so the relay's claim (no indexed column changes, status neither)
-- is a HOT update: its new row version stays on the page and no index gets an entry for it.
CREATE TABLE IF NOT EXISTS ba_outbox_events (
    id            bigserial PRIMARY KEY,
    aggregate_id  uuid NOT NULL,
    event_type    text NOT NULL,
    payload       jsonb NOT NULL,
    status        text NOT NULL DEFAULT 'PENDING',
    created_at    timestamptz NOT NULL DEFAULT now(),
    sent_at       timestamptz NULL,
    claimed_by    text NULL,
    claimed_until timestamptz NULL,
    attempts      int NOT NULL DEFAULT 0
) WITH (fillfactor = 50);
CREATE INDEX IF NOT EXISTS ba_outbox_events_pending_idx
    ON ba_outbox_events (id) WHERE status = 'PENDING';

-- One notification per inserting statement (not per row), and only when it inserted rows: a sweep page writes
-- its events in one statement (often none in a steady state, and a statement trigger fires even for zero rows),
-- so a page costs at most one pg_notify; those of one transaction merge. The relay's follow mode listens.
CREATE OR REPLACE FUNCTION ba_outbox_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted_events) THEN
        PERFORM pg_notify('batch_assets_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER ba_outbox_events_inserted
    AFTER INSERT ON ba_outbox_events
    REFERENCING NEW TABLE AS inserted_events
    FOR EACH STATEMENT EXECUTE FUNCTION ba_outbox_events_notify();
