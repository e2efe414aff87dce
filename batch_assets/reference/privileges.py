"""The grants the reference project's jobs need on its own tables, besides the library's bookkeeping (which each
job's spec names): checked before the CLI launches a job, so a role that lacks one is refused with one line naming
it. docs/production/privileges.md ("The reference jobs") is the same list as the SQL a DBA runs."""

from __future__ import annotations

from batch_assets import GUARDED_PRIVILEGES, Privilege, table_privileges

SWEEP = (
    *table_privileges("SELECT", "ba_rules"),
    Privilege("SELECT", "customers", columns=("id", "status", "encrypted_dob", "age_category", "next_review_date",
                                              "review_failure")),
    Privilege("UPDATE", "customers", columns=("age_category", "next_review_date", "review_failure", "updated_at")),
    # INSERT ... ON CONFLICT (customer_id, to_category, effective_date) DO NOTHING reads the conflict's columns.
    Privilege("SELECT", "review_triggers", columns=("customer_id", "to_category", "effective_date")),
    *table_privileges("INSERT", "review_triggers"),
    Privilege("USAGE", "review_triggers_id_seq", "sequence"),
    *table_privileges("INSERT", "outbox_events"),
    Privilege("USAGE", "outbox_events_id_seq", "sequence"),
)

EXPIRY = (
    *table_privileges("SELECT, UPDATE", "subscriptions"),
    *table_privileges("SELECT, DELETE", "enrollments"),
    *GUARDED_PRIVILEGES,
)

PRIVILEGES: dict[str, tuple[Privilege, ...]] = {
    "customer_status_sweep_job": SWEEP,
    "subscription_expiry_job": EXPIRY,
}
"""Job name (its spec's op job) → the grants on the reference project's tables it needs."""
