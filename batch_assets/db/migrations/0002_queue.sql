-- 0002: the resident payment queue (CONTRACT §7, version 2): priorities with aging,
-- the claim-order index, wake-up notifications and the worker's recorded state.
-- Idempotent: every object is guarded, so running the file twice changes nothing.

-- Priority: higher is claimed first. NOT NULL with a default, so writers that know only
-- the version-1 columns keep working.
ALTER TABLE payments ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0;

-- The claim rank: ordering by it ascending is ordering by effective priority descending,
-- where effective priority = priority + (seconds due) / 60 (the aging interval). A payment
-- therefore gains one priority level per minute it has been due, and is never starved.
--
-- Why a function: `timestamptz - interval` is only STABLE (an interval with days or months
-- depends on the time zone), so PostgreSQL refuses it in an index expression. The interval
-- here is a whole number of seconds, which never depends on the time zone, so the result is
-- immutable and the declaration is true. The planner does not inline an IMMUTABLE function
-- whose body is STABLE, so the claim's ORDER BY matches the index expression as written.
CREATE OR REPLACE FUNCTION payment_claim_rank(next_attempt_at timestamptz, priority smallint)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN next_attempt_at - make_interval(secs => priority::double precision * 60);

-- The claim reads NEW rows in rank order from this index and stops at its LIMIT, so a claim
-- stays an index scan however many rows are queued (EXPLAIN test with 1M rows).
CREATE INDEX IF NOT EXISTS payments_claim_rank_idx
    ON payments (payment_claim_rank(next_attempt_at, priority)) WHERE status = 'NEW';

-- Wake-up: one notification per statement that makes at least one payment due now (an
-- INSERT by another service, a COPY, a DLQ replay, a claim given back). Statement-level
-- triggers with transition tables, so a COPY of 100k rows sends one notification, not 100k.
-- The payload is empty: identical notifications of one transaction are merged by the server,
-- and a worker only needs to know "look now".
CREATE OR REPLACE FUNCTION payments_notify_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM due_rows WHERE status = 'NEW' AND next_attempt_at <= now()) THEN
        PERFORM pg_notify('batch_assets_payments_due', '');
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS payments_notify_due_insert ON payments;
CREATE TRIGGER payments_notify_due_insert
    AFTER INSERT ON payments
    REFERENCING NEW TABLE AS due_rows
    FOR EACH STATEMENT EXECUTE FUNCTION payments_notify_due();

DROP TRIGGER IF EXISTS payments_notify_due_update ON payments;
CREATE TRIGGER payments_notify_due_update
    AFTER UPDATE ON payments
    REFERENCING NEW TABLE AS due_rows
    FOR EACH STATEMENT EXECUTE FUNCTION payments_notify_due();

-- What workers last recorded about the queue: the outage breaker's state (for `queue stats`
-- and Dagster) and who recorded it. One row per queue name.
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
