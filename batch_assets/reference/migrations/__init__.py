"""The reference project's migration set: its tables (customers, review_triggers, outbox_events, subscriptions,
enrollments, payments, ba_rules) with their indexes, triggers and functions, applied after the library's own
set wherever the reference project is loaded (`batch-assets db migrate` in this repository).

Numbered `NNNN_name.sql` files, forward-only, every statement guarded: on a database of the previous release
(one combined set, ledger `ba_schema_versions`) they add what is missing and change nothing that is there.
"""

from __future__ import annotations

from batch_assets import MigrationSet

REFERENCE = MigrationSet("reference", "batch_assets.reference.migrations")
