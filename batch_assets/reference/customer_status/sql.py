"""The customer-status sweep's statements, by name. Bound parameters only (psycopg `:name`).

The narrow projection every read returns is the row type of the sweep:
(id uuid, encrypted_dob bytea, age_category text, next_review_date date, review_failure text,
 dob_bytes int). `encrypted_dob` is returned only when it is at most `:max_value_bytes` long (a valid
ciphertext is 12 + 10 + 16 = 38 bytes); a longer one is returned as NULL with its length in
`dob_bytes` (octet_length reads the TOAST header, not the value), so a page's memory is bounded by
page_size × max_value_bytes whatever other services store.
"""

from __future__ import annotations

import sqlalchemy as sa

_COLUMNS = (
    "id, CASE WHEN octet_length(encrypted_dob) <= :max_value_bytes THEN encrypted_dob END AS encrypted_dob, "
    "age_category, next_review_date, review_failure, octet_length(encrypted_dob) AS dob_bytes"
)

# FULL_FIRST_PAGE — full / config-change, first page of a UUID range.
# Parameters: lo uuid, hi uuid (inclusive bounds), limit int, max_value_bytes int.
FULL_FIRST_PAGE = sa.text(f"""
SELECT {_COLUMNS}
  FROM customers
 WHERE status = 'ACTIVE' AND id >= :lo AND id <= :hi
 ORDER BY id
 LIMIT :limit
""")  # noqa: S608 — only the constant column list is interpolated

# FULL_AFTER_PAGE — full / config-change, the page after a cursor.
# Parameters: after uuid (cursor, exclusive), hi uuid (inclusive), limit int, max_value_bytes int.
FULL_AFTER_PAGE = sa.text(f"""
SELECT {_COLUMNS}
  FROM customers
 WHERE status = 'ACTIVE' AND id > :after AND id <= :hi
 ORDER BY id
 LIMIT :limit
""")  # noqa: S608

# DELTA_FIRST_PAGE — delta, first page: due (NULL or <= run date), in customers_due_idx order.
# Parameters: run_date date, limit int, max_value_bytes int.
DELTA_FIRST_PAGE = sa.text(f"""
SELECT {_COLUMNS}
  FROM customers
 WHERE status = 'ACTIVE' AND coalesce(next_review_date, '-infinity'::date) <= :run_date
 ORDER BY coalesce(next_review_date, '-infinity'::date), id
 LIMIT :limit
""")  # noqa: S608

# DELTA_AFTER_PAGE — delta, the page after a cursor (coalesce(next_review_date, '-infinity'), id).
# Parameters: after_date text ('YYYY-MM-DD' or '-infinity'), after_id uuid, run_date date, limit int,
#             max_value_bytes int.
DELTA_AFTER_PAGE = sa.text(f"""
SELECT {_COLUMNS}
  FROM customers
 WHERE status = 'ACTIVE'
   AND coalesce(next_review_date, '-infinity'::date) <= :run_date
   AND (coalesce(next_review_date, '-infinity'::date), id) > (CAST(:after_date AS date), :after_id)
 ORDER BY coalesce(next_review_date, '-infinity'::date), id
 LIMIT :limit
""")  # noqa: S608

# OVERSIZED_PART — a part of an encrypted_dob too long for a page's read, while it still has the length read (no
# row when it was edited since: the reader then does not judge it). Read a part at a time, so a value of any length
# is authenticated in bounded memory.
# Parameters: id uuid, size int (octet_length read), start int (1-based), length int.
OVERSIZED_PART = sa.text("""
SELECT substring(encrypted_dob FROM :start FOR :length)
  FROM customers
 WHERE id = :id AND octet_length(encrypted_dob) = :size
""")

# WRITE_PAGE — one statement for the whole page: the category and its next_review_date stamp for
# every changed row (UPDATE ... FROM unnest), its review trigger (a transition) and one
# age_category_changed outbox event per row whose category changed, both built in SQL from the rows
# actually updated, so a trigger or an event exists exactly when its row's change committed.
# A row is updated only if it still holds every column that was read (docs/reference/tables.md): status, the
# source encrypted_dob (compared whole; a value that was too long to read is compared by its length,
# which is all its outcome depended on), age_category, next_review_date and review_failure. A row
# another service edited meanwhile is not written and is counted as a conflict: writing
# encrypted_dob cleared its next_review_date (trigger customers_dob_written), so it is due for the
# next run, and no trigger or event computed from the old value is written.
# The payload holds ids and categories only: never a date of birth, never next_review_date.
# A failed row is written only to record its failure kind in review_failure (category kept,
# date made due); a successful one clears review_failure.
# Parameters: ids uuid[], old_dobs bytea (every encrypted_dob read, concatenated: one parameter is ~5 ms
#             cheaper per 1000-row page than a bytea[]), old_offsets int[] (where a row's value starts in
#             old_dobs, 1-based; NULL when none was read), old_lengths int[] (octet_length read),
#             old_categories text[], old_dates date[], old_failures text[], new_categories text[],
#             new_dates date[], failures text[] (NULL for a successful evaluation), trigger_dates date[]
#             (effective date of the transition's review trigger, NULL for none).
# Returns one row: (successful rows updated, outbox events inserted, review triggers inserted,
#                   rows not updated because they changed since the read).
WRITE_PAGE = sa.text("""
WITH v AS (
    SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:old_offsets AS int[]), CAST(:old_lengths AS int[]),
                         CAST(:old_categories AS text[]), CAST(:old_dates AS date[]),
                         CAST(:old_failures AS text[]), CAST(:new_categories AS text[]),
                         CAST(:new_dates AS date[]), CAST(:failures AS text[]), CAST(:trigger_dates AS date[]))
        AS v(id, old_offset, old_length, old_category, old_date, old_failure, new_category, new_date, failure,
             trigger_date)
), updated AS (
    UPDATE customers AS c
       SET age_category = v.new_category, next_review_date = v.new_date, review_failure = v.failure,
           updated_at = now()
      FROM v
     WHERE c.id = v.id
       AND c.status = 'ACTIVE'
       AND octet_length(c.encrypted_dob) IS NOT DISTINCT FROM v.old_length
       AND (v.old_offset IS NULL
            OR c.encrypted_dob = substring(CAST(:old_dobs AS bytea) FROM v.old_offset FOR v.old_length))
       AND c.age_category IS NOT DISTINCT FROM v.old_category
       AND c.next_review_date IS NOT DISTINCT FROM v.old_date
       AND c.review_failure IS NOT DISTINCT FROM v.old_failure
    RETURNING c.id, v.old_category, v.new_category, v.failure, v.trigger_date
), triggers AS (
    INSERT INTO review_triggers (customer_id, from_category, to_category, effective_date)
    SELECT u.id, u.old_category, u.new_category, u.trigger_date
      FROM updated AS u
     WHERE u.failure IS NULL AND u.trigger_date IS NOT NULL
    ON CONFLICT (customer_id, to_category, effective_date) DO NOTHING
    RETURNING 1
), events AS (
    INSERT INTO outbox_events (aggregate_id, event_type, payload)
    SELECT u.id, 'age_category_changed',
           jsonb_build_object('customer_id', u.id, 'from_category', u.old_category,
                              'to_category', u.new_category)
      FROM updated AS u
     WHERE u.failure IS NULL AND u.old_category IS DISTINCT FROM u.new_category
    RETURNING 1
)
SELECT (SELECT count(*) FROM updated WHERE failure IS NULL), (SELECT count(*) FROM events),
       (SELECT count(*) FROM triggers), (SELECT count(*) FROM v) - (SELECT count(*) FROM updated)
""")

# CURRENT_RULES — the highest version of ba_rules. No parameters.
CURRENT_RULES = sa.text("SELECT version, rules, fingerprint FROM ba_rules ORDER BY version DESC LIMIT 1")

# PREVIOUS_RULES — the version just below the current one. No parameters.
PREVIOUS_RULES = sa.text("SELECT version, rules, fingerprint FROM ba_rules ORDER BY version DESC LIMIT 1 OFFSET 1")

# RULE_CHANGES_SINCE_LAST_SETTLE — how many rules versions were created since the last successful
# full or config-change sweep started (every row was settled by it), or ever when none ran.
# No parameters. ba_run_history rows of a whole run have no "range" key (per-range rows do).
RULE_CHANGES_SINCE_LAST_SETTLE = sa.text("""
SELECT count(*) FROM ba_rules
 WHERE created_at > coalesce(
       (SELECT max(started_at) FROM ba_run_history
         WHERE job LIKE 'customer_status_sweep%' AND mode IN ('full', 'config-change')
           AND status = 'SUCCESS' AND NOT (summary ? 'range')),
       '-infinity'::timestamptz)
""")

# INSERT_RULES — a new version. Parameters: rules jsonb (text), fingerprint text.
INSERT_RULES = sa.text("""
INSERT INTO ba_rules (rules, fingerprint) VALUES (CAST(:rules AS jsonb), :fingerprint)
RETURNING version
""")

# LOCK_RULES — serialise concurrent set_rules calls. No parameters.
LOCK_RULES = sa.text("LOCK TABLE ba_rules IN SHARE ROW EXCLUSIVE MODE")

# FIRST_VERSION_OF — the first rules version that had a fingerprint (the rules sensor's run key).
#   :fingerprint  text  a rules fingerprint
# Returns min(version), NULL for the built-in defaults (never stored).
FIRST_VERSION_OF = sa.text("SELECT min(version) FROM ba_rules WHERE fingerprint = :fingerprint")

# RULES_AGE_S — seconds since the current rules version was set (database time); NULL when none was set.
# No parameters.
RULES_AGE_S = sa.text(
    "SELECT extract(epoch FROM now() - created_at)::float8 FROM ba_rules ORDER BY version DESC LIMIT 1"
)

# CATEGORY_COUNTS — ACTIVE customers by age_category (asset metadata). No parameters.
CATEGORY_COUNTS = sa.text(
    "SELECT coalesce(age_category, '(not computed)') AS category, count(*) AS n "
    "FROM customers WHERE status = 'ACTIVE' GROUP BY 1 ORDER BY 1"
)

# LAST_DELTA_SQL — the latest successful delta sweep: its run date and how many rows it could not
# evaluate (the no_overdue_active_customers check). No parameters.
LAST_DELTA_SQL = sa.text(
    """
    SELECT run_date, coalesce((summary->>'failed')::bigint, 0) AS failed
      FROM ba_run_history
     WHERE job LIKE 'customer_status%' AND mode = 'delta' AND status = 'SUCCESS'
     ORDER BY finished_at DESC
     LIMIT 1
    """
)

# OVERDUE_SQL — ACTIVE customers still due on or before a run date (index customers_due_idx).
#   :run_date  date  the last delta's run date
OVERDUE_SQL = sa.text(
    """
    SELECT count(*) FROM customers
     WHERE status = 'ACTIVE'
       AND coalesce(next_review_date, '-infinity'::date) <= :run_date
       AND next_review_date IS NOT NULL
    """
)

# DUPLICATE_TRIGGERS_SQL — review-trigger keys written more than once (must be 0). No parameters.
DUPLICATE_TRIGGERS_SQL = sa.text(
    """
    SELECT count(*) FROM (
        SELECT 1 FROM review_triggers
         GROUP BY customer_id, to_category, effective_date
        HAVING count(*) > 1
    ) d
    """
)
