"""What a declaration takes from the code location it is loaded in.

In a team's own Dagster project a declaration is self-contained: it builds its own resources (keys prefixed with
its name, so two declarations never clash), needs a database URL (its `database_url`, else
BATCH_ASSETS_DATABASE_URL; never an embedded server), writes its events to the library's own outbox table and
leaves its schedules STOPPED unless it says `status: RUNNING`. In this repository's code location it shares the
location's resources, may use the embedded server, writes to the reference project's `outbox_events` and follows
BATCH_ASSETS_AUTOMATION like every other job there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LocationDefaults:
    """What a declaration takes from its code location: `REPOSITORY` (this repository's) or `TEAM` (a team's own)."""

    shared_resources: bool
    """Use the code location's resources (`database`, `job_lock`, ...) instead of the declaration's own."""
    embedded_fallback: bool
    """With no database URL at all, start the embedded server (this repository's location only)."""
    outbox_table: str
    """Where a declared sweep's events go."""
    automation_from_environment: bool
    """Schedules follow BATCH_ASSETS_AUTOMATION (RUNNING by default) instead of the declaration's own status
    (STOPPED unless it says RUNNING)."""


REPOSITORY = LocationDefaults(shared_resources=True, embedded_fallback=True, outbox_table="outbox_events",
                              automation_from_environment=True)
"""This repository's code location."""

TEAM = LocationDefaults(shared_resources=False, embedded_fallback=False, outbox_table="ba_outbox_events",
                        automation_from_environment=False)
"""A team's own Dagster project."""
