-- 0009: customers loses customers_active_id_idx, a partial copy of its primary key (id WHERE status = 'ACTIVE').
-- It was made (0001) so that a full sweep's keyset read walked an id index in order even right after a bulk
-- load, before any statistics. The sweep's reader connection has since pinned that plan itself (enable_sort and
-- enable_bitmapscan off, engine/runner.py PIN_READ_PLAN_SQL), so the primary key serves the same read, in the
-- same order, with no sort (tests/integration/test_sweep_pages.py checks the plan with and without statistics).
-- What the copy cost: a sweep's write changes next_review_date, which customers_due_idx indexes, so no update is
-- HOT and every row written added an entry to each of the table's indexes, this one included; at 10M rows it was
-- 604 MiB beside the heap's 1,133, inserted into at every seed and every write. Idempotent.
DROP INDEX IF EXISTS customers_active_id_idx;
