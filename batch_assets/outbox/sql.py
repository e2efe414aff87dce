"""The outbox relay's statements, by name: `sa.text` with bound parameters only.

Every write after a claim is fenced by the claim (`claimed_by = :owner`), so a relay whose claim
moved to another relay changes nothing.
"""

from __future__ import annotations

import re

import sqlalchemy as sa

# CLAIM_BATCH — claim the oldest PENDING events with no live claim, in one autocommit statement,
# bounded in rows (:limit) and in bytes (:max_bytes of stored payload, pg_column_size: the first event
# is always taken, whatever its size, so one huge event cannot block the relay).
#   :limit      int    events per batch
#   :max_bytes  int    payload bytes per batch
#   :owner      text   the relay's owner string ("<run id>@<host>:<pid>")
#   :lease_s    float  claim lease in seconds (claimed_until = now() + lease)
#   :after      bigint the highest id this relay pass claimed so far (0 at the start of a pass): the walk of
#                      outbox_events_pending_idx starts there, not at the first entry. The entries of the
#                      events already sent stay in the index, dead, until VACUUM; walking over them on every
#                      claim made each claim cost more than the one before (measured: 1 s per claim of 500
#                      after draining 25k). An event whose id is below :after and that commits late is
#                      claimed by the next pass, which starts again at 0.
# Returns the claimed events (any order; the caller sorts by id) and, on each row, how many events were
# locked as candidates: fewer claimed than candidates, or :limit candidates, means more are PENDING.
# The payload comes back as its JSON text (payload_json): the relay splices it into the message as is,
# never decoding and re-encoding it (that round trip was most of the relay's own CPU per event).
# The candidates the byte budget left out are unlocked when the statement ends, still unclaimed.
CLAIM_BATCH_SQL = """
WITH candidates AS (
    SELECT id, pg_column_size(payload) AS size FROM outbox_events
     WHERE status = 'PENDING' AND (claimed_until IS NULL OR claimed_until < now()) AND id > :after
     ORDER BY id
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
), batch AS (
    SELECT id FROM (
        SELECT id, sum(size) OVER (ORDER BY id) AS running, row_number() OVER (ORDER BY id) AS n
          FROM candidates
    ) AS c
     WHERE n = 1 OR running <= :max_bytes
)
UPDATE outbox_events o
   SET claimed_by = :owner,
       claimed_until = now() + make_interval(secs => :lease_s),
       attempts = o.attempts + 1
  FROM batch
 WHERE o.id = batch.id
RETURNING o.id, o.aggregate_id::text AS aggregate_id, o.event_type, o.payload::text AS payload_json, o.created_at,
          (SELECT count(*) FROM candidates) AS candidates
"""
CLAIM_BATCH = sa.text(CLAIM_BATCH_SQL).bindparams(sa.bindparam("lease_s", type_=sa.Float),
                                                   sa.bindparam("after", type_=sa.BigInteger))
# The same statement in the driver's own placeholders (%(name)s; `::` casts untouched): the relay runs it on the
# psycopg cursor and builds its events from plain tuples, half the client CPU per event of SQLAlchemy rows
# (measured: 3.5 against 5.8-7.5 us per event claimed), which is most of what the relay adds to the broker.
CLAIM_BATCH_DRIVER = re.sub(r"(?<!:):(\w+)", r"%(\1)s", CLAIM_BATCH_SQL)

# PIN_CLAIM_PLAN / UNPIN_CLAIM_PLAN — the claiming connection's session (relay._claiming): the claim walks
# outbox_events_pending_idx in id order from :after and updates its rows through the primary key. Right
# after a sweep inserted its events (statistics from before them) the planner otherwise took a bitmap scan
# of every PENDING row plus a sort to find the candidates, and a hash join over a sequential scan of the
# whole table (SENT rows included) to update them: each claim cost a pass over the table, a drain the square
# of its backlog. Bitmap scans and hash and merge joins are off for this session only. enable_sort stays on
# (unlike the sweep reader's pin): the claim's window sorts its 500 candidates either way, and a disabled
# sort's cost penalty pushed the plan over jit_above_cost, which compiled every claim (1.5 s each); JIT is
# off for the same reason.
PIN_CLAIM_PLAN = (
    "SELECT set_config('enable_bitmapscan', 'off', false), set_config('enable_hashjoin', 'off', false), "
    "set_config('enable_mergejoin', 'off', false), set_config('jit', 'off', false)"
)
UNPIN_CLAIM_PLAN = "RESET enable_bitmapscan; RESET enable_hashjoin; RESET enable_mergejoin; RESET jit"

# MARK_SENT — after the sink accepted the batch; fenced by the claim.
#   :ids    bigint[]  the batch (the relay passes its array literal, '{1,2,...}': one text parameter)
#   :owner  text      the claiming relay
# Returns one row: how many were marked SENT (rows whose claim moved to another relay are not). One statement
# per confirmed batch, the ids as one array parameter: `id = ANY(array)` is an index scan of the batch's ids
# (a join with unnest(array) was planned as a scan of every PENDING row: its cost grew with the backlog).
MARK_SENT_SQL = """
WITH marked AS (
    UPDATE outbox_events
       SET status = 'SENT', sent_at = now(), claimed_by = NULL, claimed_until = NULL
     WHERE id = ANY(CAST(:ids AS bigint[])) AND status = 'PENDING' AND claimed_by = :owner
    RETURNING 1
)
SELECT count(*) FROM marked
"""
MARK_SENT = sa.text(MARK_SENT_SQL)
# The relay runs it on the psycopg cursor (as the claim): SQLAlchemy's execute and result cost more client CPU than
# the statement's own round trip.
MARK_SENT_DRIVER = re.sub(r"(?<!:):(\w+)", r"%(\1)s", MARK_SENT_SQL)

# RELEASE_CLAIM — the sink refused the batch: give the claim back so the next pass retries it.
#   :ids    bigint[]  the batch
#   :owner  text      the claiming relay
RELEASE_CLAIM = sa.text(
    """
UPDATE outbox_events SET claimed_by = NULL, claimed_until = NULL
 WHERE id = ANY(CAST(:ids AS bigint[])) AND status = 'PENDING' AND claimed_by = :owner
"""
)

# LIVE_CLAIMANTS — the owners of live claims on PENDING events.
LIVE_CLAIMANTS = sa.text(
    "SELECT DISTINCT claimed_by FROM outbox_events WHERE status = 'PENDING' AND claimed_until > now()"
)

# FREE_DEAD_CLAIMS — give back the claims of a relay whose process is provably gone (locking.owner).
#   :dead  text  the dead relay's owner string
FREE_DEAD_CLAIMS = sa.text(
    """
UPDATE outbox_events SET claimed_by = NULL, claimed_until = NULL
 WHERE status = 'PENDING' AND claimed_by = :dead
"""
)

# BACKLOG — pending count and the age in seconds of the oldest pending event (0 when none).
BACKLOG = sa.text(
    """
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_pending_s
  FROM outbox_events WHERE status = 'PENDING'
"""
)

# EVENTS_BY_STATUS — rows of outbox_events by status (run metadata). No parameters.
EVENTS_BY_STATUS = sa.text("SELECT status, count(*) AS n FROM outbox_events GROUP BY status ORDER BY status")
