-- 0006: a PROCESSING payment whose claimed_until is NULL (written by another service) is a lapsed
-- claim, so due at once (CONTRACT §3 v3): the wake-up notification of migration 0002 is sent for
-- it too, so an idle worker claims it at once instead of at its next poll. The product never leaves
-- a PROCESSING row without a lease (its claims set claimed_until; its results leave PROCESSING), so
-- its own statements send nothing more. Idempotent (CREATE OR REPLACE); the triggers stay as they are.
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
