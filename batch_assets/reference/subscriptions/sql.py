"""The subscription expiry's statements, by name (docs/guide/subscriptions.md). Bound parameters only (`sa.text`,
`:name`).

The narrow projection every read returns is the row type of the expiry sweep: (id bigint, expiry_date date).
"""

from __future__ import annotations

import sqlalchemy as sa

# NIGHTLY_BATCH — next ACTIVE subscriptions past their expiry, keyset on (expiry_date, id)
# (subscriptions_expiring_idx). One statement for the first batch and the next ones: at the start
# the position is (-infinity, the smallest bigint), a constant, so the index range scan stays.
#   :run_date    date    expire rows with expiry_date < run date
#   :after_date  date    keyset: expiry_date of the last row seen (NULL at the start = -infinity)
#   :after_id    bigint  keyset: id of the last row seen (the smallest bigint at the start)
#   :limit       int     batch size
NIGHTLY_BATCH = sa.text(
    """
SELECT id, expiry_date
  FROM subscriptions
 WHERE status = 'ACTIVE' AND expiry_date < :run_date
   AND (expiry_date, id) > (coalesce(CAST(:after_date AS date), '-infinity'::date), :after_id)
 ORDER BY expiry_date, id
 LIMIT :limit
"""
)

# RETRY_BATCH — next FAILED subscriptions still under the retry limit, keyset on id
# (subscriptions_failed_idx).
#   :run_date     date    only rows still past their expiry
#   :max_retries  int     retry_count must be below this
#   :after_id     bigint  keyset: id of the last row seen (the smallest bigint at the start)
#   :limit        int     batch size
RETRY_BATCH = sa.text(
    """
SELECT id, expiry_date
  FROM subscriptions
 WHERE status = 'FAILED' AND retry_count < :max_retries AND expiry_date < :run_date
   AND id > :after_id
 ORDER BY id
 LIMIT :limit
"""
)

# EXPIRE_BATCH — a whole batch in one statement: mark EXPIRED every subscription that still holds
# what was read (the selected status and the same expiry_date: docs/reference/tables.md) and is past its expiry,
# and delete exactly those subscriptions' enrollments. A subscription another writer changed since
# the read (renewed, closed, moved) is not touched: it is counted as a conflict and the next run
# selects it again if it is still due. Run in one short transaction, so each subscription is still
# all-or-nothing; if the statement fails (one bad row), the engine redoes the batch one subscription
# per transaction (EXPIRE_ONE).
#   :ids           bigint[] subscription ids of the batch
#   :expiry_dates  date[]   their expiry_date as read
#   :from_status   text     ACTIVE (nightly) or FAILED (retry)
#   :run_date      date     the run date
# Returns one row: (subscriptions expired, enrollments deleted, subscriptions changed since the read).
EXPIRE_BATCH = sa.text(
    """
WITH expired AS (
    UPDATE subscriptions AS s
       SET status = 'EXPIRED', last_error = NULL
      FROM unnest(CAST(:ids AS bigint[]), CAST(:expiry_dates AS date[])) AS v(id, expiry_date)
     WHERE s.id = v.id AND s.status = :from_status AND s.expiry_date = v.expiry_date
       AND s.expiry_date < :run_date
    RETURNING s.id
), deleted AS (
    DELETE FROM enrollments WHERE subscription_id IN (SELECT id FROM expired)
    RETURNING 1
)
SELECT (SELECT count(*) FROM expired), (SELECT count(*) FROM deleted),
       cardinality(CAST(:ids AS bigint[])) - (SELECT count(*) FROM expired)
"""
)

# EXPIRE_ONE — mark one subscription EXPIRED if it still holds what was read (status, expiry_date)
# and is past its expiry; followed by DELETE_ENROLLMENTS in the same transaction.
#   :id           bigint  subscription id
#   :expiry_date  date    its expiry_date as read
#   :from_status  text    ACTIVE (nightly) or FAILED (retry)
#   :run_date     date    the run date
# Returns the id when the row was changed; nothing when another writer changed it meanwhile (a conflict).
EXPIRE_ONE = sa.text(
    """
UPDATE subscriptions
   SET status = 'EXPIRED', last_error = NULL
 WHERE id = :id AND status = :from_status AND expiry_date = :expiry_date AND expiry_date < :run_date
RETURNING id
"""
)

# DELETE_ENROLLMENTS — the enrollments of one subscription (enrollments_subscription_idx).
#   :id  bigint  subscription id
DELETE_ENROLLMENTS = sa.text("DELETE FROM enrollments WHERE subscription_id = :id")

# MARK_FAILED — record a failed expiry: FAILED, retry_count + 1, last_error (a transaction of its own,
# after the failed one rolled back; FAILED rows leave the nightly selection). Only if the row still
# holds what was read: a subscription renewed meanwhile is not marked FAILED for an expiry it no
# longer needs.
#   :id           bigint  subscription id
#   :expiry_date  date    its expiry_date as read
#   :from_status  text    the state the row was selected in (ACTIVE or FAILED)
#   :error        text    one line, clipped
# Returns the new retry_count (nothing when another writer changed the row meanwhile).
MARK_FAILED = sa.text(
    """
UPDATE subscriptions
   SET status = 'FAILED', retry_count = retry_count + 1, last_error = :error
 WHERE id = :id AND status = :from_status AND expiry_date = :expiry_date
RETURNING retry_count
"""
)

# FAILED_SUBSCRIPTIONS_SQL — FAILED subscriptions and their highest retry_count (asset check). No parameters.
FAILED_SUBSCRIPTIONS_SQL = sa.text(
    "SELECT count(*), coalesce(max(retry_count), 0) FROM subscriptions WHERE status = 'FAILED'"
)

# SUBSCRIPTIONS_BY_STATUS — rows of subscriptions by status (run metadata). No parameters.
SUBSCRIPTIONS_BY_STATUS = sa.text("SELECT status, count(*) AS n FROM subscriptions GROUP BY status ORDER BY status")
