"""Every SQL text of one queue, written from its `QueueSpec`. psycopg `%(name)s` parameters only.

Fencing: every write after a claim matches `status = 'PROCESSING' AND <token column> = <token>`. A
worker whose lease passed and whose row was claimed again by another worker holds a stale token, so
its write matches 0 rows and cannot overwrite the new owner's result. A row leaves PROCESSING with
its first successful fenced write, so DONE is set at most once.

Identifiers come from a validated spec and are double-quoted (`spec.quote`); values are always
bound parameters.
"""

from __future__ import annotations

from batch_assets.queue.spec import QueueSpec, quote

# The claim rank of a declared queue with a priority column: ordering by it ascending is ordering by
# effective priority descending, priority + (seconds due) / 60. Immutable (a whole number of seconds
# never depends on the time zone), so it can be an index expression; not inlined by the planner, so
# the claim's ORDER BY matches the index as written. The same rule as payment_claim_rank (0002).
RANK_FUNCTION_DDL = """
CREATE OR REPLACE FUNCTION ba_queue_claim_rank(next_attempt_at timestamptz, priority integer)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN next_attempt_at - make_interval(secs => priority::double precision * 60)
"""

# RECORD_STATE — record this worker's view of the outage breaker for `queue stats` and Dagster.
#   %(queue)s text · %(breaker)s closed|open|half_open · %(cooldown_s)s float (NULL when closed)
#   %(failures)s int (transient failures in a row) · %(worker)s text (host:pid)
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

# QUEUE_STATE — the last recorded breaker state of a queue.   %(queue)s text
QUEUE_STATE = (
    "SELECT breaker, breaker_since, cooldown_s, recorded_by, updated_at FROM ba_queue_state WHERE queue = %(queue)s"
)

# COLUMN_TYPES — the columns of a table and their types (`db migrate` and the worker refuse a table
# lacking one).   %(table)s text  [schema.]table as declared
COLUMN_TYPES = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
  FROM pg_attribute a
 WHERE a.attrelid = to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped
"""

# TRIGGER_EXISTS — whether the table has a trigger of that name.   %(table)s text [schema.]table · %(trigger)s text
TRIGGER_EXISTS = "SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(%(table)s) AND tgname = %(trigger)s"


class Statements:
    """The statements of one queue (see each attribute's comment for its parameters and result)."""

    def __init__(self, spec: QueueSpec) -> None:
        self.spec = spec
        t, k, kt = quote(spec.table), quote(spec.key), spec.key_type
        tok = quote(spec.token_column)
        cols = ", ".join(f"p.{quote(c)}" for c in spec.columns)
        rank = f"{spec.rank_function}(next_attempt_at, {quote(spec.priority)})" if spec.priority else "next_attempt_at"
        self.rank = rank
        self.channel = spec.channel
        self.listen = f'LISTEN "{spec.channel}"'

        # claim — claim up to %(n)s due rows in one atomic statement.
        #   %(n)s int batch size (also each branch's limit) · %(lease_s)s float claim lease (claimed_until =
        #   now() + lease) · %(token)s uuid the claim token written to every claimed row (fencing)
        # Returns key, attempts (after the increment), lapsed (the row was PROCESSING under a claim of ours
        # whose lease passed: with a claim token and a claimed_until), then the declared columns. last_error
        # (unbounded when another service writes it) is never read here.
        # Three branches, each on a partial index: NEW rows that are due, in claim-rank order (the claim
        # index: with a priority, higher first, one level gained per minute due); PROCESSING rows whose lease
        # passed (the processing index); PROCESSING rows with no lease at all (claimed_until NULL, written by
        # another service: a lapsed claim, docs/reference/tables.md; `IS NULL` is an index condition). Each branch
        # locks with SKIP LOCKED, so concurrent claimers never get the same row and never wait; the union is
        # cut to %(n)s; rows locked by a branch but cut by the outer LIMIT are unlocked at commit.
        # attempts: a negative count is taken as 0 and the count stops short of the int maximum, so no row
        # another service wrote can make the statement fail for the whole batch (docs/reference/tables.md).
        # `key = ANY(ARRAY(...))` makes the update a primary-key lookup per claimed row; a join alone lets
        # the planner hash-join against a scan of the whole table.
        due = f"""
WITH due AS MATERIALIZED (
       SELECT c.id, c.lapsed
         FROM (
               SELECT fresh.id, fresh.rank, false AS lapsed
                 FROM (SELECT {k} AS id, {rank} AS rank
                         FROM {t}
                        WHERE status = 'NEW' AND next_attempt_at <= now()
                        ORDER BY {rank}
                        LIMIT %(n)s
                          FOR UPDATE SKIP LOCKED) AS fresh
               UNION ALL
               SELECT stale.id, stale.rank, stale.lapsed
                 FROM (SELECT {k} AS id, claimed_until AS rank, {tok} IS NOT NULL AS lapsed
                         FROM {t}
                        WHERE status = 'PROCESSING' AND claimed_until < now()
                        ORDER BY claimed_until
                        LIMIT %(n)s
                          FOR UPDATE SKIP LOCKED) AS stale
               UNION ALL
               SELECT orphan.id, '-infinity'::timestamptz, false
                 FROM (SELECT {k} AS id
                         FROM {t}
                        WHERE status = 'PROCESSING' AND claimed_until IS NULL
                        LIMIT %(n)s
                          FOR UPDATE SKIP LOCKED) AS orphan
              ) AS c
        ORDER BY c.rank
        LIMIT %(n)s)"""  # noqa: S608
        update = f"""
UPDATE {t} AS p
   SET status        = 'PROCESSING',
       attempts      = least(greatest(p.attempts, 0), 2147483646) + 1,
       claimed_until = now() + make_interval(secs => %(lease_s)s),
       {tok} = %(token)s
  FROM due
 WHERE p.{k} = ANY(ARRAY(SELECT id FROM due)) AND p.{k} = due.id
RETURNING p.{k}, p.attempts, due.lapsed, {cols}"""  # noqa: S608
        self.claim = f"{due}{update}\n"

        # claim_with_slots — `claim`, and call slots of a queue with rate_limit_per_s for the rows it claimed,
        # in the same statement (ratelimit.py: no round trip of their own when the limit does not bind).
        #   %(n)s %(lease_s)s %(token)s as claim · %(queue)s text · %(most)s int slots at most
        #   %(rate)s float8 calls/s · %(horizon_s)s float8 (the parameters of ba_rate_take, db/migrations)
        # Returns what `claim` returns, each row followed by granted (int: slots reserved, up to the rows
        # claimed and %(most)s, fewer or none when the horizon is full) and first_in_s (float8: seconds from
        # the server's now until the first of them, the others 1/rate apart). No row claimed: no slot taken.
        self.claim_with_slots = f"""{due},
claimed AS ({update}),
slots AS MATERIALIZED (
       SELECT granted, first_in_s
         FROM ba_rate_take(%(queue)s, least((SELECT count(*) FROM claimed)::int, %(most)s), 1, %(rate)s,
                           %(horizon_s)s))
SELECT claimed.*, slots.granted, slots.first_in_s FROM claimed CROSS JOIN slots
"""  # noqa: S608

        # claimed_by_token — rows a claim statement took whose answer never arrived (the connection died).
        #   %(token)s uuid. Returns what `claim` returns (lapsed unknown by then: false, so the row gets its
        #   call). Only PROCESSING rows: one that left PROCESSING, or was claimed again under another token,
        #   is not ours.
        self.claimed_by_token = (
            f"SELECT p.{k}, p.attempts, false, {cols} FROM {t} AS p"  # noqa: S608
            f" WHERE p.status = 'PROCESSING' AND p.{tok} = %(token)s"
        )

        # write_results — a batch of results in one statement, each fenced by its claim token.
        #   %(ids)b key[] · %(tokens)b uuid[] · %(statuses)b text[] DONE, FAILED or NEW (a retry, or a claim
        #   given back) · %(undo)b int[] 1 gives the claim's attempt back (never called) · %(delays)b float8[]
        #   NEW only: seconds until next_attempt_at · %(errors)b text[] last_error, or NULL to keep the stored one
        # The arrays are sent in binary (`%(name)b`): psycopg writes a text array element by element in
        # Python with a quoting check each, four times the client's CPU of the binary form per flushed row.
        # Returns the 1-based position (in the arrays) of every row written; a row whose claim was lost
        # matches nothing, so DONE is written at most once.
        self.write_results = f"""
UPDATE {t} AS p
   SET status          = r.status,
       attempts        = greatest(p.attempts - r.undo, 0),
       next_attempt_at = CASE WHEN r.status = 'NEW' THEN now() + make_interval(secs => r.delay_s)
                              ELSE p.next_attempt_at END,
       claimed_until   = NULL,
       {tok} = CASE WHEN r.status = 'NEW' THEN NULL ELSE p.{tok} END,
       last_error      = coalesce(r.error, p.last_error),
       processed_at    = CASE WHEN r.status = 'NEW' THEN p.processed_at ELSE now() END
  FROM unnest(%(ids)b::{kt}[], %(tokens)b::uuid[], %(statuses)b::text[], %(undo)b::int[],
              %(delays)b::float8[], %(errors)b::text[])
       WITH ORDINALITY AS r(id, token, status, undo, delay_s, error, ord)
 WHERE p.{k} = ANY(%(ids)b::{kt}[]) AND p.{k} = r.id AND p.status = 'PROCESSING' AND p.{tok} = r.token
RETURNING r.ord
"""  # noqa: S608

        # renew — extend the lease of claims still held (liveness.py): claimed_until = now() + %(lease_s)s.
        #   %(keys)b key[] · %(tokens)b uuid[] the claim token of each key (binary, as write_results)
        #   %(lease_s)s float8
        # Fenced like a result: only rows still PROCESSING under that token, so a row finished, given back or
        # claimed again by another worker is never revived. Returns the keys renewed.
        self.renew = f"""
UPDATE {t} AS p
   SET claimed_until = now() + make_interval(secs => %(lease_s)s)
  FROM unnest(%(keys)b::{kt}[], %(tokens)b::uuid[]) AS r(id, token)
 WHERE p.{k} = ANY(%(keys)b::{kt}[]) AND p.{k} = r.id AND p.status = 'PROCESSING' AND p.{tok} = r.token
RETURNING p.{k}
"""  # noqa: S608

        # next_due_in — seconds until the earliest NEW row is due or the earliest claim lapses (negative:
        # already due; 0: a PROCESSING row without a lease; NULL: nothing queued). Each term is a min or an
        # existence test over a partial index; cut to ±1 day, so ±'infinity' another service wrote is a far
        # wait or due now.
        self.next_due_in = f"""
SELECT CASE WHEN t IS NOT NULL
            THEN extract(epoch FROM least(greatest(t, now() - interval '1 day'), now() + interval '1 day') - now())
       END::float8
  FROM (SELECT least(
           (SELECT min(next_attempt_at) FROM {t} WHERE status = 'NEW'),
           (SELECT min(claimed_until) FROM {t} WHERE status = 'PROCESSING'),
           (SELECT now() WHERE EXISTS (SELECT FROM {t} WHERE status = 'PROCESSING' AND claimed_until IS NULL))
       ) AS t) AS earliest
"""  # noqa: S608

        # oldest_due_s — age in seconds of the oldest due row (NEW and due, or a lapsed claim); 0 when none.
        # A PROCESSING row without a lease counts as due since its next_attempt_at; '-infinity' counts as
        # 100 years ago (infinite times cannot be subtracted).
        self.oldest_due_s = f"""
SELECT CASE WHEN t IS NULL THEN 0
            ELSE extract(epoch FROM now() - greatest(t, now() - interval '100 years')) END::float8
  FROM (SELECT least(
           (SELECT min(next_attempt_at) FROM {t} WHERE status = 'NEW' AND next_attempt_at <= now()),
           (SELECT min(claimed_until) FROM {t} WHERE status = 'PROCESSING' AND claimed_until < now()),
           (SELECT min(next_attempt_at) FROM {t} WHERE status = 'PROCESSING' AND claimed_until IS NULL)
       ) AS t) AS oldest
"""  # noqa: S608

        # stats — counts by status (any status another service wrote, by its own name), due NEW rows,
        # lapsed claims (lease passed, or none at all), rows made to wait forever ('infinity').
        self.stats = f"""
SELECT status,
       count(*) AS n,
       count(*) FILTER (WHERE status = 'NEW' AND next_attempt_at <= now()) AS due,
       count(*) FILTER (WHERE status = 'PROCESSING' AND (claimed_until < now() OR claimed_until IS NULL)) AS stuck,
       count(*) FILTER (WHERE (status = 'NEW' AND next_attempt_at = 'infinity')
                           OR (status = 'PROCESSING' AND claimed_until = 'infinity')) AS never_due
  FROM {t}
 GROUP BY status
"""  # noqa: S608
        # stuck — lapsed claims and the oldest lease (asset check).
        self.stuck = (
            f"SELECT count(*), min(claimed_until)::text FROM {t}"  # noqa: S608
            " WHERE status = 'PROCESSING' AND (claimed_until < now() OR claimed_until IS NULL)"
        )

        # dlq_first / dlq_after — FAILED rows in key order (the failed index), a page of %(limit)s, after
        # %(after)s (dlq_after). last_error is read cut to %(error_chars)s characters (another service may
        # have written any size); timestamps written as ±infinity (no Python datetime) are read as NULL.
        listed = [f"{quote(c)}" for c in dict.fromkeys((spec.key, *spec.columns))]
        stamps = [f"CASE WHEN isfinite({quote(c)}) THEN {quote(c)} END AS {quote(c)}"
                  for c in (*spec.timestamps, "processed_at")]
        head = (f"SELECT {', '.join(listed)}, attempts, left(last_error, %(error_chars)s) AS last_error, "  # noqa: S608
                f"{', '.join(stamps)} FROM {t} WHERE status = 'FAILED'")
        self.dlq_columns = [*dict.fromkeys((spec.key, *spec.columns)), "attempts", "last_error",
                            *spec.timestamps, "processed_at"]
        self.dlq_first = f"{head} ORDER BY {k} LIMIT %(limit)s"
        self.dlq_after = f"{head} AND {k} > %(after)s ORDER BY {k} LIMIT %(limit)s"
        self.dlq_count = f"SELECT count(*) FROM {t} WHERE status = 'FAILED'"  # noqa: S608
        # dlq_replay_ids — FAILED → NEW for %(ids)s (key[]); others are left alone. last_error is kept (why
        # it was dead-lettered) until the next attempt overwrites it.  dlq_replay_batch — the next %(limit)s.
        reset = ("SET status = 'NEW', attempts = 0, next_attempt_at = now(), claimed_until = NULL, "
                 f"{tok} = NULL, processed_at = NULL")
        self.dlq_replay_ids = (f"UPDATE {t} {reset} WHERE {k} = ANY(%(ids)s::{kt}[]) AND status = 'FAILED' "
                               f"RETURNING {k}")
        self.dlq_replay_batch = (
            f"UPDATE {t} {reset} WHERE {k} IN (SELECT {k} FROM {t} WHERE status = 'FAILED' ORDER BY {k} "  # noqa: S608
            f"LIMIT %(limit)s FOR UPDATE SKIP LOCKED) RETURNING {k}"
        )
        # status_of — current status of %(ids)s (key[]), to report ids a replay skipped.
        self.status_of = f"SELECT {k}, status FROM {t} WHERE {k} = ANY(%(ids)s::{kt}[])"  # noqa: S608
        self.install = self._install(t, rank)

    def _install(self, t: str, rank: str) -> list[str]:
        """What `db migrate` installs on the table, each statement safe to run again.

        The product's claim token column (`spec.token_column`, nullable: writers that do not know it keep
        working); the claim index (claim-rank order of NEW rows), the processing index (leases) and the failed
        index (DLQ); the wake-up trigger: one notification per statement that makes at least one row due now
        (statement-level, with a transition table, so a COPY of 100k rows sends one).
        """
        p = self.spec.prefix
        ddl = [f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {quote(self.spec.token_column)} uuid NULL"]
        if self.spec.priority and self.spec.rank_function == "ba_queue_claim_rank":
            ddl.append(RANK_FUNCTION_DDL)
        ddl += [
            f'CREATE INDEX IF NOT EXISTS "{p}_claim_rank_idx" ON {t} (({rank})) WHERE status = \'NEW\'',
            f'CREATE INDEX IF NOT EXISTS "{p}_processing_idx" ON {t} (claimed_until) WHERE status = \'PROCESSING\'',
            f'CREATE INDEX IF NOT EXISTS "{p}_failed_idx" ON {t} ({quote(self.spec.key)}) WHERE status = \'FAILED\'',
            f"""CREATE OR REPLACE FUNCTION "{p}_notify_due"() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM due_rows
                WHERE (status = 'NEW' AND next_attempt_at <= now())
                   OR (status = 'PROCESSING' AND claimed_until IS NULL)) THEN
        PERFORM pg_notify('{self.channel}', '');
    END IF;
    RETURN NULL;
END
$$""",  # noqa: S608
        ]
        # CREATE OR REPLACE (PostgreSQL 14+): no moment without the trigger while other services write.
        ddl += [
            f'CREATE OR REPLACE TRIGGER "{p}_notify_due_{event}" AFTER {event.upper()} ON {t} '
            f'REFERENCING NEW TABLE AS due_rows FOR EACH STATEMENT EXECUTE FUNCTION "{p}_notify_due"()'
            for event in ("insert", "update")
        ]
        return ddl
