"""Named statements of the payment queue. Bound parameters only.

Fencing: every write after a claim matches `status = 'PROCESSING' AND claim_token = :token`.
A worker whose lease passed and whose row was claimed again by another worker holds a
stale token, so its write matches 0 rows and cannot overwrite the new owner's result.
A row leaves PROCESSING with its first successful fenced write, so DONE is set at most once.
"""

from __future__ import annotations

import sqlalchemy as sa

# CLAIM — claim up to :n due payments in one atomic statement.
#   :n        int    batch size (also the limit of each branch)
#   :lease_s  float  claim lease in seconds (claimed_until = now() + lease)
#   :token    uuid   the claim token written to every claimed row (fencing)
# Returns id, amount_cents, attempts (after the increment).
# Two branches, one per partial index: NEW rows that are due (payments_new_due_idx, ordered
# like the index) and PROCESSING rows whose lease passed (payments_processing_idx). Each branch
# locks with SKIP LOCKED, so concurrent claimers never get the same row and never wait; the
# union is merged by due time and cut to :n. Rows locked by a branch but cut by the outer
# LIMIT are unlocked when this single-statement transaction commits.
CLAIM = sa.text(
    """
UPDATE payments AS p
   SET status        = 'PROCESSING',
       attempts      = p.attempts + 1,
       claimed_until = now() + make_interval(secs => :lease_s),
       claim_token   = :token
 WHERE p.id IN (
       SELECT due.id
         FROM (
               SELECT fresh.id, fresh.due_at
                 FROM (SELECT id, next_attempt_at AS due_at
                         FROM payments
                        WHERE status = 'NEW' AND next_attempt_at <= now()
                        ORDER BY next_attempt_at, created_at
                        LIMIT :n
                          FOR UPDATE SKIP LOCKED) AS fresh
               UNION ALL
               SELECT stale.id, stale.due_at
                 FROM (SELECT id, claimed_until AS due_at
                         FROM payments
                        WHERE status = 'PROCESSING' AND claimed_until < now()
                        ORDER BY claimed_until
                        LIMIT :n
                          FOR UPDATE SKIP LOCKED) AS stale
              ) AS due
        ORDER BY due.due_at
        LIMIT :n)
RETURNING p.id, p.amount_cents, p.attempts
"""
)

# COMPLETE — mark a claimed payment DONE (fenced).
#   :id     uuid  payment id
#   :token  uuid  the claim token of this worker's claim
# Matches 0 rows when the claim was lost.
COMPLETE = sa.text(
    """
UPDATE payments
   SET status = 'DONE', processed_at = now(), claimed_until = NULL
 WHERE id = :id AND status = 'PROCESSING' AND claim_token = :token
"""
)

# RETRY — put a claimed payment back to NEW after a delay (fenced).
#   :id       uuid   payment id
#   :token    uuid   the claim token of this worker's claim
#   :delay_s  float  backoff in seconds (next_attempt_at = now() + delay)
#   :error    text   the error of this attempt (kept in last_error)
RETRY = sa.text(
    """
UPDATE payments
   SET status          = 'NEW',
       next_attempt_at = now() + make_interval(secs => :delay_s),
       claimed_until   = NULL,
       claim_token     = NULL,
       last_error      = :error
 WHERE id = :id AND status = 'PROCESSING' AND claim_token = :token
"""
)

# FAIL — mark a claimed payment FAILED, terminal (fenced).
#   :id     uuid  payment id
#   :token  uuid  the claim token of this worker's claim
#   :error  text  the reason, kept in last_error
FAIL = sa.text(
    """
UPDATE payments
   SET status = 'FAILED', processed_at = now(), claimed_until = NULL, last_error = :error
 WHERE id = :id AND status = 'PROCESSING' AND claim_token = :token
"""
)

# RELEASE — give back a claim that was never started (graceful stop), undoing its attempt.
#   :id     uuid  payment id
#   :token  uuid  the claim token of this worker's claim
RELEASE = sa.text(
    """
UPDATE payments
   SET status = 'NEW', attempts = greatest(attempts - 1, 0), claimed_until = NULL, claim_token = NULL
 WHERE id = :id AND status = 'PROCESSING' AND claim_token = :token
"""
)

# DLQ_LIST — FAILED payments in id order (payments_failed_idx), keyset after :after_id.
#   :after_id  uuid  exclusive lower bound; the nil uuid for the first page
#   :limit     int   page size
DLQ_LIST = sa.text(
    """
SELECT id, amount_cents, attempts, last_error, created_at, processed_at
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

# STATS — counts by status, due NEW rows and PROCESSING rows whose claim lease passed.
STATS = sa.text(
    """
SELECT status,
       count(*) AS n,
       count(*) FILTER (WHERE status = 'NEW' AND next_attempt_at <= now()) AS due,
       count(*) FILTER (WHERE status = 'PROCESSING' AND claimed_until < now()) AS stuck
  FROM payments
 GROUP BY status
"""
)

# COPY_PAYMENTS — bulk insert of new payments (psycopg COPY); other columns take their defaults.
COPY_PAYMENTS = "COPY payments (id, amount_cents) FROM STDIN"
