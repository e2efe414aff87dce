"""Named statements of retention (docs/production/operations.md). Each runs in a transaction of its own, over at most
one
batch: a window of ids (`:lo` < id <= `:hi`) on the primary key, so no statement scans or locks more than
`:hi - :lo` rows whatever the table's size. Business tables are never named here.
"""

from __future__ import annotations

import sqlalchemy as sa

# ID_SPAN_<table> — the smallest and largest id to look at (no parameters).
OUTBOX_ID_SPAN = sa.text("SELECT min(id), max(id) FROM outbox_events")
RUN_HISTORY_ID_SPAN = sa.text("SELECT min(id), max(id) FROM ba_run_history")

# DELETE_SENT_EVENTS — SENT outbox events sent before the cutoff, in one id window.
# :lo, :hi (bigint, the window lo < id <= hi), :cutoff (timestamptz). PENDING events are never touched.
DELETE_SENT_EVENTS = sa.text(
    """
    DELETE FROM outbox_events
     WHERE id > :lo AND id <= :hi AND status = 'SENT' AND sent_at < :cutoff
    """
)

# DELETE_RUN_HISTORY — run history rows of runs that finished before the cutoff, in one id window.
# :lo, :hi (bigint), :cutoff (timestamptz).
DELETE_RUN_HISTORY = sa.text(
    """
    DELETE FROM ba_run_history
     WHERE id > :lo AND id <= :hi AND finished_at < :cutoff
    """
)

# DELETE_FINISHED_CHECKPOINTS — checkpoints of generations whose every range is DONE and none was
# written after the cutoff (a finished run), and DONE checkpoints without a generation (the engine on its
# own) older than the cutoff. A row of an unfinished generation (any range PLANNED or RUNNING) is never
# deleted, DONE or not. :cutoff (timestamptz), :batch (int, generations per statement).
DELETE_FINISHED_CHECKPOINTS = sa.text(
    """
    WITH finished AS (
        SELECT generation FROM ba_checkpoints
         WHERE generation IS NOT NULL
         GROUP BY generation
        HAVING bool_and(status = 'DONE') AND max(updated_at) < :cutoff
         LIMIT :batch
    )
    DELETE FROM ba_checkpoints c
     WHERE (c.generation IN (SELECT generation FROM finished))
        OR (c.generation IS NULL AND c.status = 'DONE' AND c.updated_at < :cutoff)
    """
)

# CUTOFF — now() minus :days (int) on the database clock.
CUTOFF = sa.text("SELECT now() - make_interval(days => :days)")
