-- The team's own table: notifications to send. The queue columns are the payments' (docs/reference/tables.md):
-- status, attempts, next_attempt_at, claimed_until, last_error, processed_at; priority is optional.
CREATE TABLE IF NOT EXISTS notifications (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    recipient       text NOT NULL,
    body            text NOT NULL,
    status          text NOT NULL DEFAULT 'NEW',
    attempts        int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_until   timestamptz NULL,
    last_error      text NULL,
    processed_at    timestamptz NULL,
    priority        smallint NOT NULL DEFAULT 0
);
