"""The loyalty tier of an account: the function defs.yaml names (`compute: tiers:compute`)."""

from datetime import date, timedelta

from batch_assets import RowFailure

TIERS = ((10_000, "GOLD"), (1_000, "SILVER"), (0, "BRONZE"))
REVIEW_EVERY = timedelta(days=30)


def compute(row, run_date: date) -> dict:
    """The tier for the account's points, reviewed again in 30 days."""
    points = row["points"]
    if points is None or points < 0:
        raise RowFailure("missing_points")  # this row's own data: counted, left due, nothing written
    tier = next(name for floor, name in TIERS if points >= floor)
    return {"tier": tier, "tier_review_on": run_date + REVIEW_EVERY}
