"""The customer-status sweep's names: its jobs, ops, lock and checkpoints keep the names they always had, so runs,
checkpoints and locks of earlier releases stay its own."""

from __future__ import annotations

from batch_assets import SweepNames
from batch_assets.reference.customer_status.sweep import SWEEP_NAME

SWEEP_JOB_KEY = "customer_status_sweep"
"""The lock and lease name shared by delta, full and config-change (they never overlap)."""

NAMES = SweepNames(
    job="customer_status_sweep_job", asset="customer_status", lock=SWEEP_JOB_KEY, checkpoint=SWEEP_NAME,
    graph="customer_status_sweep", plan_op="plan_sweep", range_op="sweep_range", summarise_op="summarise_sweep",
    report_op="report_customer_status", asset_job="customer_status_asset_job", variant_base="customer_status_sweep",
)
