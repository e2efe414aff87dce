"""The reference project as a code location: its jobs, its queue and its migrations, beside the library's relay and
retention and the declarations under BATCH_ASSETS_DEFS_DIR."""

from __future__ import annotations

from batch_assets import LIBRARY_JOB_MODULES, REPOSITORY, Project, load_declarations
from batch_assets.reference.migrations import REFERENCE
from batch_assets.reference.privileges import PRIVILEGES

JOB_MODULES: dict[str, tuple[str, ...]] = {
    "batch_assets.reference.customer_status.dagster": (
        "customer_status_sweep_job", "customer_status_sweep_celery_job", "customer_status_asset_job"),
    "batch_assets.reference.subscriptions.dagster": ("subscription_expiry_job",),
    "batch_assets.reference.payments.dagster": ("payment_queue_drain_job", "payment_status_observation_job"),
    **LIBRARY_JOB_MODULES,
}
"""Each job's module (its `SPEC`) and the job names that spec answers for: the CLI launching one job imports that
job's module only (start-up), the code location all of them."""


def reference_project() -> Project:
    return Project(
        name="batch_assets", module="batch_assets.definitions", attribute="defs", job_modules=JOB_MODULES,
        queue_targets=("batch_assets.reference.payments.declaration:PAYMENTS_QUEUE",),
        migrations=(REFERENCE,), privileges=PRIVILEGES,
        defaults=REPOSITORY, declarations=load_declarations,
    )


PROJECT = reference_project()
"""This repository's code location (`batch_assets.definitions` loads it)."""
