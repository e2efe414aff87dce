"""Named statements of the payment queue. Bound parameters only.

Fencing: every write after a claim matches `status = 'PROCESSING' AND claim_token = :token`.
A worker whose lease passed and whose row was claimed again by another worker holds a
stale token, so its write matches 0 rows and cannot overwrite the new owner's result.
A row leaves PROCESSING with its first successful fenced write, so DONE is set at most once.
"""

from __future__ import annotations

import sqlalchemy as sa

# The statements the worker runs on its own psycopg connection are plain strings in psycopg's
# `%(name)s` style; the synchronous helpers of queue.py run the same strings through
# `Connection.exec_driver_sql`, so each statement has one text.

# CLAIM — claim up to %(n)s due payments in one atomic statement.
#   %(n)s        int    batch size (also the limit of each branch)
#   %(lease_s)s  float  claim lease in seconds (claimed_until = now() + lease)
#   %(token)s    uuid   the claim token written to every claimed row (fencing)
# Returns id, amount_cents, attempts (after the increment), lapsed (the row was PROCESSING under a
# claim of ours whose lease passed, i.e. with a claim token and a claimed_until: a row without a lease
# was never left so by us, whatever token it kept). Only fixed-size
# columns: last_error (text, unbounded when another service writes it) is never read here.
# Three branches, each on a partial index: NEW rows that are due, in claim-rank order
# (payments_claim_rank_idx: higher priority first, one level gained per minute due); PROCESSING
# rows whose lease passed (payments_processing_idx); PROCESSING rows with no lease at all
# (claimed_until NULL, written by another service: a lapsed claim, CONTRACT §3 v3; the same index,
# `IS NULL` is an index condition). Each branch locks with SKIP LOCKED, so concurrent claimers never
# get the same row and never wait; the union is cut to %(n)s. Rows locked by a branch but cut by the
# outer LIMIT are unlocked at commit.
# attempts: a negative count is taken as 0 and the count stops short of the int maximum, so no row
# another service wrote can make the statement fail for the whole batch (CONTRACT §3).
# `id = ANY(ARRAY(...))` makes the update a primary-key lookup per claimed row; a join alone
# lets the planner hash-join against a scan of the whole table.
CLAIM = """
WITH due AS MATERIALIZED (
       SELECT c.id, c.lapsed
         FROM (
               SELECT fresh.id, fresh.rank, false AS lapsed
                 FROM (SELECT id, payment_claim_rank(next_attempt_at, priority) AS rank
                         FROM payments
                        WHERE status = 'NEW' AND next_attempt_at <= now()
                        ORDER BY payment_claim_rank(next_attempt_at, priority)
                        LIMIT %(n)s
                          FOR UPDATE SKIP LOCKED) AS fresh
               UNION ALL
               SELECT stale.id, stale.rank, stale.lapsed
                 FROM (SELECT id, claimed_until AS rank, claim_token IS NOT NULL AS lapsed
                         FROM payments
                        WHERE status = 'PROCESSING' AND claimed_until < now()
                        ORDER BY claimed_until
                        LIMIT %(n)s
                          FOR UPDATE SKIP LOCKED) AS stale
               UNION ALL
               SELECT orphan.id, '-infinity'::timestamptz, false
                 FROM (SELECT id
                         FROM payments
                        WHERE status = 'PROCESSING' AND claimed_until IS NULL
                        LIMIT %(n)s
                          FOR UPDATE SKIP LOCKED) AS orphan
              ) AS c
        ORDER BY c.rank
        LIMIT %(n)s)
UPDATE payments AS p
   SET status        = 'PROCESSING',
       attempts      = least(greatest(p.attempts, 0), 2147483646) + 1,
       claimed_until = now() + make_interval(secs => %(lease_s)s),
       claim_token   = %(token)s
  FROM due
 WHERE p.id = ANY(ARRAY(SELECT id FROM due)) AND p.id = due.id
RETURNING p.id, p.amount_cents, p.attempts, due.lapsed
"""

# CLAIMED_BY_TOKEN — rows a claim statement took whose answer never arrived (the connection died).
#   %(token)s  uuid  the claim token of that statement
# Returns id, amount_cents, attempts, lapsed as CLAIM does (lapsed is unknown by then: false, so such a
# row gets its call). Only PROCESSING rows (payments_processing_idx): a row that already left
# PROCESSING, or was claimed again under another token, is not ours.
CLAIMED_BY_TOKEN = """
SELECT id, amount_cents, attempts, false
  FROM payments
 WHERE status = 'PROCESSING' AND claim_token = %(token)s
"""

# WRITE_RESULTS — write a batch of results in one statement, each fenced by its claim token.
#   %(ids)s       uuid[]    payment ids
#   %(tokens)s    uuid[]    the claim token of each payment's claim
#   %(statuses)s  text[]    DONE, FAILED, or NEW (a retry, or a claim given back)
#   %(undo)s      int[]     1 gives the claim's attempt back (never called: stop, open breaker), else 0
#   %(delays)s    float8[]  NEW only: seconds until next_attempt_at (backoff; 0 = due now)
#   %(errors)s    text[]    last_error to record, or NULL to keep the stored one
# `p.id = ANY(ids)` keeps the join on primary-key lookups whatever the statistics say.
# Returns the 1-based position (in the arrays) of every row written; a row whose claim was lost (another
# worker holds a newer token, or it already left PROCESSING) matches nothing, so DONE is
# written at most once and a stale claim cannot overwrite the new owner's result.
WRITE_RESULTS = """
UPDATE payments AS p
   SET status          = r.status,
       attempts        = greatest(p.attempts - r.undo, 0),
       next_attempt_at = CASE WHEN r.status = 'NEW' THEN now() + make_interval(secs => r.delay_s)
                              ELSE p.next_attempt_at END,
       claimed_until   = NULL,
       claim_token     = CASE WHEN r.status = 'NEW' THEN NULL ELSE p.claim_token END,
       last_error      = coalesce(r.error, p.last_error),
       processed_at    = CASE WHEN r.status = 'NEW' THEN p.processed_at ELSE now() END
  FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(statuses)s::text[], %(undo)s::int[],
              %(delays)s::float8[], %(errors)s::text[])
       WITH ORDINALITY AS r(id, token, status, undo, delay_s, error, ord)
 WHERE p.id = ANY(%(ids)s::uuid[]) AND p.id = r.id AND p.status = 'PROCESSING' AND p.claim_token = r.token
RETURNING r.ord
"""

# NEXT_DUE_IN — seconds until the earliest NEW row is due or the earliest claim lapses
# (negative: already due; 0: a PROCESSING row without a lease, due now; NULL: nothing queued).
# Each term is a min or an existence test over a partial index. Cut to ±1 day, so a time another
# service wrote as 'infinity' or '-infinity' (which cannot be subtracted) is a far wait or due now.
NEXT_DUE_IN = """
SELECT CASE WHEN t IS NOT NULL
            THEN extract(epoch FROM least(greatest(t, now() - interval '1 day'), now() + interval '1 day') - now())
       END::float8
  FROM (SELECT least(
           (SELECT min(next_attempt_at) FROM payments WHERE status = 'NEW'),
           (SELECT min(claimed_until) FROM payments WHERE status = 'PROCESSING'),
           (SELECT now() WHERE EXISTS (SELECT FROM payments WHERE status = 'PROCESSING' AND claimed_until IS NULL))
       ) AS t) AS earliest
"""

# RECORD_STATE — record this worker's view of the outage breaker for `queue stats` and Dagster.
#   %(queue)s       text   the queue name ('payments')
#   %(breaker)s     text   closed | open | half_open
#   %(cooldown_s)s  float  the current cool-down (NULL when closed)
#   %(failures)s    int    transient failures in a row
#   %(worker)s      text   who records it (host:pid)
RECORD_STATE = """
INSERT INTO ba_queue_state AS s (queue, breaker, breaker_since, cooldown_s, failures_in_row, recorded_by, updated_at)
VALUES (%(queue)s, %(breaker)s, now(), %(cooldown_s)s, %(failures)s, %(worker)s, now())
ON CONFLICT (queue) DO UPDATE
   SET breaker         = excluded.breaker,
       breaker_since   = CASE WHEN s.breaker = excluded.breaker THEN s.breaker_since ELSE now() END,
       cooldown_s      = excluded.cooldown_s,
       failures_in_row = excluded.failures_in_row,
       recorded_by     = excluded.recorded_by,
       updated_at      = now()
"""

# QUEUE_STATE — the last recorded breaker state of a queue.
#   %(queue)s  text  the queue name
QUEUE_STATE = (
    "SELECT breaker, breaker_since, cooldown_s, recorded_by, updated_at FROM ba_queue_state WHERE queue = %(queue)s"
)

# OLDEST_DUE_S — age in seconds of the oldest due payment (NEW and due, or a lapsed claim); 0 when none.
# A PROCESSING row without a lease (claimed_until NULL) counts as due since its next_attempt_at.
# A time another service wrote as '-infinity' counts as 100 years ago (infinite times cannot be subtracted).
OLDEST_DUE_S = """
SELECT CASE WHEN t IS NULL THEN 0  -- (greatest() would skip the NULL)
            ELSE extract(epoch FROM now() - greatest(t, now() - interval '100 years')) END::float8
  FROM (SELECT least(
           (SELECT min(next_attempt_at) FROM payments WHERE status = 'NEW' AND next_attempt_at <= now()),
           (SELECT min(claimed_until) FROM payments WHERE status = 'PROCESSING' AND claimed_until < now()),
           (SELECT min(next_attempt_at) FROM payments WHERE status = 'PROCESSING' AND claimed_until IS NULL)
       ) AS t) AS oldest
"""

# LISTEN_DUE — the channel the payments_notify_due triggers notify (migrations 0002 and 0006: due NEW
# rows, and PROCESSING rows without a lease).
DUE_CHANNEL = "batch_assets_payments_due"
LISTEN_DUE = "LISTEN batch_assets_payments_due"

# DLQ_LIST — FAILED payments in id order (payments_failed_idx), keyset after :after_id.
#   :after_id    uuid  exclusive lower bound; the nil uuid for the first page
#   :limit       int   page size
#   :error_chars int   last_error is read cut to this many characters (another service may have
#                      written any size there): a page is bounded in bytes as well as rows
# created_at / processed_at another service wrote as ±infinity (no Python datetime) are read as NULL.
DLQ_LIST = sa.text(
    """
SELECT id, amount_cents, attempts, left(last_error, :error_chars) AS last_error,
       CASE WHEN isfinite(created_at) THEN created_at END AS created_at,
       CASE WHEN isfinite(processed_at) THEN processed_at END AS processed_at
  FROM payments
 WHERE status = 'FAILED' AND id > :after_id
 ORDER BY id
 LIMIT :limit
"""
)

# DLQ_COUNT — number of FAILED payments.
DLQ_COUNT = sa.text("SELECT count(*) FROM payments WHERE status = 'FAILED'")

# DLQ_REPLAY_IDS — FAILED → NEW for the given ids; others are left alone.
#   :ids  uuid[]  payment ids
# last_error is kept (the reason it was dead-lettered) until the next attempt overwrites it.
DLQ_REPLAY_IDS = sa.text(
    """
UPDATE payments
   SET status = 'NEW', attempts = 0, next_attempt_at = now(),
       claimed_until = NULL, claim_token = NULL, processed_at = NULL
 WHERE id = ANY(:ids) AND status = 'FAILED'
RETURNING id
"""
)

# DLQ_REPLAY_BATCH — FAILED → NEW for the next :limit FAILED rows (replay everything, in batches).
#   :limit  int  batch size
DLQ_REPLAY_BATCH = sa.text(
    """
UPDATE payments
   SET status = 'NEW', attempts = 0, next_attempt_at = now(),
       claimed_until = NULL, claim_token = NULL, processed_at = NULL
 WHERE id IN (SELECT id FROM payments WHERE status = 'FAILED' ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED)
RETURNING id
"""
)

# STATUS_OF — current status of the given ids (to report ids a replay skipped).
#   :ids  uuid[]  payment ids
STATUS_OF = sa.text("SELECT id, status FROM payments WHERE id = ANY(:ids)")

# STATS — counts by status (any status another service wrote, by its own name), due NEW rows,
# PROCESSING rows whose claim lapsed: lease passed, or no lease at all (claimed_until NULL, §3 v3), and
# rows another service made wait forever (next_attempt_at or claimed_until 'infinity').
STATS = sa.text(
    """
SELECT status,
       count(*) AS n,
       count(*) FILTER (WHERE status = 'NEW' AND next_attempt_at <= now()) AS due,
       count(*) FILTER (WHERE status = 'PROCESSING' AND (claimed_until < now() OR claimed_until IS NULL)) AS stuck,
       count(*) FILTER (WHERE (status = 'NEW' AND next_attempt_at = 'infinity')
                           OR (status = 'PROCESSING' AND claimed_until = 'infinity')) AS never_due
  FROM payments
 GROUP BY status
"""
)

# COPY_PAYMENTS — bulk insert of new payments (psycopg COPY); other columns take their defaults.
COPY_PAYMENTS = "COPY payments (id, amount_cents, priority) FROM STDIN"

# STUCK_PAYMENTS_SQL — PROCESSING payments past their claim lease or without one (claimed_until NULL),
# and the oldest lease (asset check).
STUCK_PAYMENTS_SQL = sa.text(
    "SELECT count(*), min(claimed_until)::text FROM payments"
    " WHERE status = 'PROCESSING' AND (claimed_until < now() OR claimed_until IS NULL)"
)

# PAYMENTS_BY_STATUS — rows of payments by status (run metadata). No parameters.
PAYMENTS_BY_STATUS = sa.text("SELECT status, count(*) AS n FROM payments GROUP BY status ORDER BY status")
