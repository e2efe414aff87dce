-- 0001_initial: the contract tables (CONTRACT §3) and the product's bookkeeping.
-- Forward-only. Every statement is guarded so a re-run is a no-op.

-- Business tables written by other services -------------------------------

CREATE TABLE IF NOT EXISTS customers (
    id               uuid PRIMARY KEY,
    status           text NOT NULL DEFAULT 'ACTIVE',
    encrypted_dob    bytea NULL,
    age_category     text NULL,
    next_review_date date NULL,
    updated_at       timestamptz NULL DEFAULT now(),
    -- Product column (nullable): the failure kind of the last evaluation that failed
    -- (missing_data, invalid_value, decrypt_failure), cleared by the next successful
    -- one. A row that fails the same way again is a known bad row, not a sign of a
    -- broken dependency, so it does not feed the sweep's circuit breaker.
    review_failure   text NULL
);

-- The delta sweep reads ACTIVE rows whose next_review_date is NULL or <= the
-- run date. NULL sorts as -infinity so "not computed yet" and "due" are one
-- index range; the keyset order (coalesce(...), id) matches the index, so the
-- delta is an index range scan with no sort, however large the backlog.
CREATE INDEX IF NOT EXISTS customers_due_idx
    ON customers ((coalesce(next_review_date, '-infinity'::date)), id)
    WHERE status = 'ACTIVE';

-- The full and config-change sweeps read ACTIVE rows in id order. The primary key
-- would do with fresh statistics, but right after a bulk load (no statistics yet)
-- the planner otherwise prefers the partial customers_due_idx (it matches the
-- status predicate) plus a sort on every page: 60x slower. This index matches the
-- predicate and the keyset order, so the plan holds without statistics.
CREATE INDEX IF NOT EXISTS customers_active_id_idx
    ON customers (id)
    WHERE status = 'ACTIVE';

-- Writing encrypted_dob clears next_review_date in the same statement, so an
-- edited row is due again on the next delta sweep (CONTRACT §3).
CREATE OR REPLACE FUNCTION customers_clear_next_review() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.next_review_date := NULL;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS customers_dob_written ON customers;
CREATE TRIGGER customers_dob_written
    BEFORE UPDATE OF encrypted_dob ON customers
    FOR EACH ROW EXECUTE FUNCTION customers_clear_next_review();

CREATE TABLE IF NOT EXISTS review_triggers (
    id             bigserial PRIMARY KEY,
    customer_id    uuid NOT NULL,
    from_category  text NOT NULL,
    to_category    text NOT NULL,
    effective_date date NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS review_triggers_natural_key
    ON review_triggers (customer_id, to_category, effective_date);

CREATE TABLE IF NOT EXISTS outbox_events (
    id           bigserial PRIMARY KEY,
    aggregate_id uuid NOT NULL,
    event_type   text NOT NULL,
    payload      jsonb NOT NULL,
    status       text NOT NULL DEFAULT 'PENDING',
    created_at   timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz NULL
);
CREATE INDEX IF NOT EXISTS outbox_events_pending_idx
    ON outbox_events (id) WHERE status = 'PENDING';

CREATE TABLE IF NOT EXISTS subscriptions (
    id          bigserial PRIMARY KEY,
    customer_id uuid NULL,
    expiry_date date NULL,
    status      text NOT NULL DEFAULT 'ACTIVE',
    retry_count int NOT NULL DEFAULT 0,
    last_error  text NULL
);
CREATE INDEX IF NOT EXISTS subscriptions_expiring_idx
    ON subscriptions (expiry_date, id) WHERE status = 'ACTIVE';
CREATE INDEX IF NOT EXISTS subscriptions_failed_idx
    ON subscriptions (id) WHERE status = 'FAILED';

CREATE TABLE IF NOT EXISTS enrollments (
    id              bigserial PRIMARY KEY,
    subscription_id bigint NOT NULL REFERENCES subscriptions (id),
    course_id       bigint NULL
);
CREATE INDEX IF NOT EXISTS enrollments_subscription_idx
    ON enrollments (subscription_id);

CREATE TABLE IF NOT EXISTS payments (
    id              uuid PRIMARY KEY,
    amount_cents    bigint NOT NULL DEFAULT 0,
    status          text NOT NULL DEFAULT 'NEW',
    attempts        int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_until   timestamptz NULL,
    last_error      text NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    processed_at    timestamptz NULL,
    -- Product column (nullable): the token of the claim that owns the row, so a
    -- worker whose claim lease passed cannot overwrite the new owner's result.
    claim_token     uuid NULL
);
CREATE INDEX IF NOT EXISTS payments_new_due_idx
    ON payments (next_attempt_at, created_at) WHERE status = 'NEW';
CREATE INDEX IF NOT EXISTS payments_processing_idx
    ON payments (claimed_until) WHERE status = 'PROCESSING';
CREATE INDEX IF NOT EXISTS payments_failed_idx
    ON payments (id) WHERE status = 'FAILED';

-- Product bookkeeping -------------------------------------------------------

-- Age-category rules, one row per version; the current version is the highest.
CREATE TABLE IF NOT EXISTS ba_rules (
    version     bigserial PRIMARY KEY,
    rules       jsonb NOT NULL,
    fingerprint text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
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

-- Low-watermark checkpoints, one per (sweep, mode, range).
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
    PRIMARY KEY (sweep, mode, range_key)
);

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
