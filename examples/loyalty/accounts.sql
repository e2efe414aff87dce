-- The example's own table (not one of batch_assets'): accounts with loyalty points and a tier to keep up to date.
CREATE TABLE IF NOT EXISTS accounts (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    status         text NOT NULL DEFAULT 'OPEN',
    points         integer,
    tier           text,
    tier_review_on date
);
-- The delta reads the due rows in (tier_review_on, id) order: this index serves it.
CREATE INDEX IF NOT EXISTS accounts_tier_due_idx
    ON accounts ((coalesce(tier_review_on, '-infinity'::date)), id) WHERE status = 'OPEN';

-- 1,000 open accounts (one without points) and 10 closed ones.
INSERT INTO accounts (status, points)
SELECT 'OPEN', CASE WHEN g = 1 THEN NULL ELSE mod(g * 37, 15000) END FROM generate_series(1, 1000) AS g;
INSERT INTO accounts (status, points) SELECT 'CLOSED', 500 FROM generate_series(1, 10);
