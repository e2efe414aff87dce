-- Operations (issue 11): the outbox relay's claim lease, and a notification for its follow mode.
-- Columns are nullable or defaulted (CONTRACT §3), so writers that know only the contract's columns keep working.

-- The claim lease: a relay owns the rows it claimed until claimed_until; SENT is fenced on claimed_by.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS claimed_by text NULL;
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS claimed_until timestamptz NULL;
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS attempts int NOT NULL DEFAULT 0;

-- One notification per inserting statement (not per row), and only when it inserted rows: a sweep
-- page writes its events in one statement (often none in a steady state, and a statement trigger
-- fires even for zero rows), so a page costs at most one pg_notify; those of one transaction merge.
CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted_events) THEN
        PERFORM pg_notify('batch_assets_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_events_inserted ON outbox_events;
CREATE TRIGGER outbox_events_inserted
    AFTER INSERT ON outbox_events
    REFERENCING NEW TABLE AS inserted_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();
