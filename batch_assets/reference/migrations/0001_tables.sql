-- 0001_tables: the reference project's tables (written by other services too, see the docs' table reference),
-- their indexes, triggers and functions, and its age-category rules (ba_rules).
-- Forward-only and idempotent: every statement is guarded, so running the file again changes nothing, and on a
-- database of the previous release, at any of its versions (one combined set 0001-0009, recorded in
-- ba_schema_versions), it adds only what that version lacks: no table is rewritten and no existing index is
-- built again. A column is added only after the catalog says it is missing, because ALTER TABLE takes an ACCESS
-- EXCLUSIVE lock even when the column is there.

-- customers -----------------------------------------------------------------------------------------------

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

-- A partial copy of the primary key (id WHERE status = 'ACTIVE') that earlier versions made, so that a full
-- sweep's keyset read walked an id index in order right after a bulk load, before any statistics. The sweep's
-- reader connection pins that plan itself now (engine/runner.py, PIN_READ_PLAN_SQL), so the primary key serves
-- the same read with no sort. What the copy cost: a sweep's write changes next_review_date, which
-- customers_due_idx indexes, so no update is HOT and every row written added an entry to this index too; at 10M
-- rows it was 604 MiB beside the heap's 1,133. A database made by an earlier version loses it here.
DROP INDEX IF EXISTS customers_active_id_idx;

-- Writing encrypted_dob clears next_review_date in the same statement, so an
-- edited row is due again on the next delta sweep.
CREATE OR REPLACE FUNCTION customers_clear_next_review() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.next_review_date := NULL;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER customers_dob_written
    BEFORE UPDATE OF encrypted_dob ON customers
    FOR EACH ROW EXECUTE FUNCTION customers_clear_next_review();

-- review_triggers -----------------------------------------------------------------------------------------

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

-- outbox_events -------------------------------------------------------------------------------------------

-- claimed_by / claimed_until / attempts: the relay's claim lease. A relay owns the rows it claimed until
-- claimed_until; SENT is fenced on claimed_by. Nullable or defaulted, so writers that know only the first
-- seven columns keep working.
-- fillfactor 50 leaves half of each page free, so the relay's claim (no indexed column changes, status
-- neither) is a HOT update: its new row version stays on the page and no index gets an entry for it. At
-- fillfactor 100 the pages a sweep filled had no room, and every claim of 500 added 1,000 index entries (the
-- primary key and outbox_events_pending_idx, which the next claims walk over until VACUUM). Measured on
-- 500-event claims: WAL 2,518 -> 1,257 records, ~2.5 us less server CPU per event claimed. On a table made
-- before, it applies to every page written after the change.
CREATE TABLE IF NOT EXISTS outbox_events (
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

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'outbox_events'::regclass
                                              AND attname = 'claimed_by' AND NOT attisdropped) THEN
        ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS claimed_by text NULL,
                                  ADD COLUMN IF NOT EXISTS claimed_until timestamptz NULL,
                                  ADD COLUMN IF NOT EXISTS attempts int NOT NULL DEFAULT 0;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_class WHERE oid = 'outbox_events'::regclass
                                          AND 'fillfactor=50' = ANY (reloptions)) THEN
        ALTER TABLE outbox_events SET (fillfactor = 50);
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS outbox_events_pending_idx
    ON outbox_events (id) WHERE status = 'PENDING';

-- One notification per inserting statement (not per row), and only when it inserted rows: a sweep page writes
-- its events in one statement (often none in a steady state, and a statement trigger fires even for zero
-- rows), so a page costs at most one pg_notify; those of one transaction merge. The relay's follow mode listens.
CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted_events) THEN
        PERFORM pg_notify('batch_assets_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER outbox_events_inserted
    AFTER INSERT ON outbox_events
    REFERENCING NEW TABLE AS inserted_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();

-- subscriptions and enrollments ---------------------------------------------------------------------------

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

-- payments ------------------------------------------------------------------------------------------------

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
    claim_token     uuid NULL,
    -- Priority: higher is claimed first. NOT NULL with a default, so writers that know only
    -- the first columns keep working.
    priority        smallint NOT NULL DEFAULT 0
);

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'payments'::regclass
                                              AND attname = 'priority' AND NOT attisdropped) THEN
        ALTER TABLE payments ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0;
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS payments_new_due_idx
    ON payments (next_attempt_at, created_at) WHERE status = 'NEW';
CREATE INDEX IF NOT EXISTS payments_processing_idx
    ON payments (claimed_until) WHERE status = 'PROCESSING';
CREATE INDEX IF NOT EXISTS payments_failed_idx
    ON payments (id) WHERE status = 'FAILED';

-- The claim rank: ordering by it ascending is ordering by effective priority descending,
-- where effective priority = priority + (seconds due) / 60 (the aging interval). A payment
-- therefore gains one priority level per minute it has been due, and is never starved.
--
-- Why a function: `timestamptz - interval` is only STABLE (an interval with days or months
-- depends on the time zone), so PostgreSQL refuses it in an index expression. The interval
-- here is a whole number of seconds, which never depends on the time zone, so the result is
-- immutable and the declaration is true. The planner does not inline an IMMUTABLE function
-- whose body is STABLE, so the claim's ORDER BY matches the index expression as written.
-- Replacing it on a database that has it changes nothing: the body is the one its index was built with.
CREATE OR REPLACE FUNCTION payment_claim_rank(next_attempt_at timestamptz, priority smallint)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN next_attempt_at - make_interval(secs => priority::double precision * 60);

-- The claim reads NEW rows in rank order from this index and stops at its LIMIT, so a claim
-- stays an index scan however many rows are queued.
CREATE INDEX IF NOT EXISTS payments_claim_rank_idx
    ON payments (payment_claim_rank(next_attempt_at, priority)) WHERE status = 'NEW';

-- Wake-up: one notification per statement that makes at least one payment due now (an INSERT by
-- another service, a COPY, a DLQ replay, a claim given back). Statement-level triggers with
-- transition tables, so a COPY of 100k rows sends one notification, not 100k. The payload is
-- empty: identical notifications of one transaction are merged by the server, and a worker only
-- needs to know "look now". A PROCESSING payment whose claimed_until is NULL (written by another
-- service) is a lapsed claim, so due at once: it is notified too. The product never leaves a
-- PROCESSING row without a lease, so its own statements send nothing more.
CREATE OR REPLACE FUNCTION payments_notify_due() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM due_rows
                WHERE (status = 'NEW' AND next_attempt_at <= now())
                   OR (status = 'PROCESSING' AND claimed_until IS NULL)) THEN
        PERFORM pg_notify('batch_assets_payments_due', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER payments_notify_due_insert
    AFTER INSERT ON payments
    REFERENCING NEW TABLE AS due_rows
    FOR EACH STATEMENT EXECUTE FUNCTION payments_notify_due();

CREATE OR REPLACE TRIGGER payments_notify_due_update
    AFTER UPDATE ON payments
    REFERENCING NEW TABLE AS due_rows
    FOR EACH STATEMENT EXECUTE FUNCTION payments_notify_due();

-- Age-category rules --------------------------------------------------------------------------------------

-- One row per version; the current version is the highest.
CREATE TABLE IF NOT EXISTS ba_rules (
    version     bigserial PRIMARY KEY,
    rules       jsonb NOT NULL,
    fingerprint text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
