"""The customer-status sweep's rules sensor: exactly one successful config-change sweep per rules change.

A run that ends SKIPPED or FAILED is requested again, with a growing delay, until one with that rules key
succeeds; rules changed again within a minute are swept once, for the latest rules.
"""

# No `from __future__ import annotations`: Dagster reads the sensor annotations at runtime.

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import dagster as dg

from batch_assets import IN_PROGRESS, AlertsResource, DatabaseResource, asset_job_run_config, latest_run_summary
from batch_assets.reference.customer_status import sql
from batch_assets.reference.customer_status.names import NAMES
from batch_assets.reference.customer_status.rules_store import current_rules


def current_fingerprint(database: DatabaseResource) -> tuple[int, str, int | None]:
    """(current version, its fingerprint, the first version that ever had this fingerprint)."""
    with database.get_engine().connect() as conn:
        version, rules = current_rules(conn)
        first = conn.execute(sql.FIRST_VERSION_OF, {"fingerprint": rules.fingerprint}).scalar()
    return version, rules.fingerprint, first


def rules_run_key(version: int, fingerprint: str, first_version: int | None) -> str:
    """The run key of the config-change sweep for a rules version: its fingerprint.

    Dagster never starts a second run for a key a sensor already used, so a change *back* to
    earlier rules (A → B → A) gets the fingerprint qualified by its version: two changes, two sweeps.
    """
    if first_version is None or first_version == version:
        return fingerprint
    return f"{fingerprint}@v{version}"


RULES_KEY_TAG = "batch_assets/rules_key"
"""Tag of every config-change run the sensor starts: the rules key (fingerprint, or fingerprint@vN)."""


def _swept(database: DatabaseResource, run_id: str) -> bool:
    """Whether the run recorded a SUCCESS summary (a SKIPPED sweep also ends Dagster-SUCCESS)."""
    summary = latest_run_summary(database.get_engine(), run_id)
    return summary is not None and summary.get("status") == "SUCCESS"


RULES_DEBOUNCE_S = 60.0
"""Rules changed again within this long are swept once, for the latest rules (docs/production/operations.md)."""
RULES_RETRY_BASE_S = 60.0
"""After a config-change attempt that did not succeed, the next waits this long, doubling per failed attempt ..."""
RULES_RETRY_MAX_S = 3600.0
"""... up to this long."""


@dataclass
class RulesSensorState:
    """The rules sensor's cursor: the rules key swept last, and the keys already alerted on (one alert per key)."""

    swept: str | None = None
    alerted: list[str] = dataclass_field(default_factory=list)

    @classmethod
    def parse(cls, cursor: str | None) -> "RulesSensorState":
        if not cursor:
            return cls()
        try:
            raw = json.loads(cursor)
        except ValueError:  # the cursor of an earlier version: the swept key itself
            return cls(swept=cursor)
        if not isinstance(raw, dict):
            return cls(swept=cursor)
        return cls(swept=raw.get("swept"), alerted=[str(k) for k in raw.get("alerted") or []])

    def dump(self) -> str:
        return json.dumps({"swept": self.swept, "alerted": self.alerted[-20:]}, sort_keys=True)


def _rules_age_s(database: DatabaseResource) -> float | None:
    with database.get_engine().connect() as conn:
        value = conn.execute(sql.RULES_AGE_S).scalar()
    return None if value is None else float(value)


def retry_delay_s(failed_attempts: int) -> float:
    """The wait before the next attempt after `failed_attempts` that did not succeed: 60 s, 120 s, 240 s, ... 1 h."""
    return min(RULES_RETRY_BASE_S * 2 ** max(failed_attempts - 1, 0), RULES_RETRY_MAX_S)


def _alert_rules_attempt(context: dg.SensorEvaluationContext, alerts: AlertsResource, key: str, run: Any,
                         attempts: int) -> None:
    text = (f"batch_assets: the config-change sweep for rules {key} did not succeed (run {run.run_id} ended "
            f"{run.status.value}); rules_changed_sensor retries it with a growing delay until one succeeds")
    context.log.error(text)
    alerts.send(text, {"kind": "rules_sweep_not_done", "rules_key": key, "run_id": run.run_id,
                       "status": run.status.value, "attempts": attempts})


def rules_changed(context: dg.SensorEvaluationContext, database: DatabaseResource,
                  alerts: AlertsResource) -> dg.SensorResult:
    """One successful config-change sweep per rules change: re-request until a run for the key succeeds.

    The cursor (RulesSensorState) moves to a rules key only once a run tagged with it ended SUCCESS *and*
    recorded a SUCCESS summary. Rules set less than RULES_DEBOUNCE_S ago wait (edits within a minute are
    swept once, for the latest rules). A run that ended SKIPPED (a CLI run held the lock) or FAILED is
    followed by a new request (run key `<key>#<attempt>`, since Dagster never reuses a run key) once
    `retry_delay_s` passed since it ended; the first such run of a key raises one alert.
    """
    state = RulesSensorState.parse(context.cursor)
    version, fingerprint, first_version = current_fingerprint(database)
    key = rules_run_key(version, fingerprint, first_version)
    if state.swept == key:
        return dg.SensorResult(skip_reason=dg.SkipReason(f"rules unchanged (v{version}, {fingerprint})"))
    if state.swept is None and version == 0:
        # Never changed since install: the default rules need no config-change sweep; remember them.
        state.swept = key
        return dg.SensorResult(skip_reason=dg.SkipReason(f"default rules ({fingerprint}); nothing changed"),
                               cursor=state.dump())
    age = _rules_age_s(database)
    if age is not None and age < RULES_DEBOUNCE_S:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"rules v{version} set {age:.0f}s ago; swept once they are {RULES_DEBOUNCE_S:.0f}s old"))
    records = context.instance.get_run_records(filters=dg.RunsFilter(tags={RULES_KEY_TAG: key}))
    runs = [record.dagster_run for record in records]
    running = [run for run in runs if run.status in IN_PROGRESS]
    if running:
        return dg.SensorResult(
            skip_reason=dg.SkipReason(f"config-change sweep {running[0].run_id} for {key} is {running[0].status.value}")
        )
    done = [run for run in runs if run.status == dg.DagsterRunStatus.SUCCESS and _swept(database, run.run_id)]
    if done:
        state.swept = key
        state.alerted = [k for k in state.alerted if k != key]
        return dg.SensorResult(
            skip_reason=dg.SkipReason(f"rules {key} swept by run {done[0].run_id}"), cursor=state.dump()
        )
    if records:
        latest = records[0]  # newest first
        if key not in state.alerted:
            _alert_rules_attempt(context, alerts, key, latest.dagster_run, len(records))
            state.alerted.append(key)
        ended = latest.end_time or (latest.update_timestamp.timestamp() if latest.update_timestamp else 0.0)
        wait_s = ended + retry_delay_s(len(records)) - time.time()
        if wait_s > 0:
            return dg.SensorResult(skip_reason=dg.SkipReason(
                f"attempt {len(records) + 1} for rules {key} in {wait_s:.0f}s (after {len(records)} that did not "
                "succeed)"), cursor=state.dump())
    attempt = len(runs) + 1
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=key if attempt == 1 else f"{key}#{attempt}",
                run_config=asset_job_run_config(NAMES, {"mode": "config-change"}),
                tags={
                    "batch_assets/mode": "config-change",
                    RULES_KEY_TAG: key,
                    "batch_assets/rules_fingerprint": fingerprint,
                    "batch_assets/rules_version": str(version),
                    "batch_assets/attempt": str(attempt),
                },
            )
        ],
        cursor=state.dump(),
    )


def sensors_for(asset_job: Any) -> Callable[[dg.DefaultSensorStatus], list[dg.SensorDefinition]]:
    """The rules sensor of the customer-status sweep, starting `asset_job` (the sweep's asset job)."""

    def build(status: dg.DefaultSensorStatus) -> list[dg.SensorDefinition]:
        return [_rules_sensor(asset_job, status)]

    return build


def _rules_sensor(asset_job: Any, status: dg.DefaultSensorStatus) -> dg.SensorDefinition:
    return (
        dg.sensor(
            name="rules_changed_sensor",
            job=asset_job,
            minimum_interval_seconds=30,
            default_status=status,
            description="Starts the config-change sweep of a rules change (run key = its fingerprint) once the rules "
            f"are {RULES_DEBOUNCE_S:.0f}s old, and requests it again, with a doubling delay from "
            f"{RULES_RETRY_BASE_S:.0f}s, until one run for that fingerprint succeeds; alerts once per fingerprint.",
        )(rules_changed)
    )
