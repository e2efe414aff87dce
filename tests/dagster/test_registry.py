"""The code location's jobs: every job is one JobSpec, and one spec is all a new job needs to be launched and loaded."""

# No `from __future__ import annotations`: Dagster reads the toy op's config and resource annotations.

import dataclasses
from collections.abc import Iterator

import dagster as dg
import pydantic
import pytest
import sqlalchemy as sa

from batch_assets import run_history
from batch_assets.definitions import PROJECT
from batch_assets.errors import ConfigError
from batch_assets.orchestration.code_location import get_job
from batch_assets.orchestration.config import config_class
from batch_assets.orchestration.launch import build_run_config, launch_job
from batch_assets.orchestration.ops import SUCCESS, empty_summary, finish, utcnow, validated_plan
from batch_assets.orchestration.project import use
from batch_assets.orchestration.resources import DatabaseResource
from batch_assets.orchestration.spec import JobSpec
from batch_assets.settings import Settings
from batch_assets.settings_model import SettingsModel

pytestmark = [pytest.mark.dagster]


class ToySettings(SettingsModel):
    """A job that counts customers, at most `limit` of them."""

    limit: int = pydantic.Field(default=10, ge=1, le=1000, description="Customers counted at most.")


ToyConfig = config_class(ToySettings, "ToyConfig", "A job that counts customers, at most `limit` of them.")


@dg.op
def count_customers(context: dg.OpExecutionContext, config: ToyConfig, database: DatabaseResource) -> dict:
    limit = validated_plan(config).limit
    engine = database.get_engine()
    with engine.connect() as conn:
        scanned = conn.exec_driver_sql("SELECT count(*) FROM (SELECT 1 FROM customers LIMIT %(n)s) c",
                                       {"n": limit}).scalar_one()
    summary = empty_summary(SUCCESS, context.run_id)
    summary.update(scanned=scanned, unchanged=scanned)
    return finish(context, engine, summary=summary, started_at=utcnow())


@dg.job
def toy_count_job() -> None:
    count_customers()


TOY = JobSpec(job=toy_count_job, config=ToyConfig, config_op="count_customers")


def test_every_registered_job_resolves_with_its_config_op_and_default_config() -> None:
    """Each spec's job (and variants) is in the code location, carries its config op, and its default config
    validates; every name a spec answers for leads back to it."""
    from batch_assets.definitions import defs

    loaded = defs() if callable(defs) else defs
    for spec in PROJECT.own_specs():
        for job in spec.op_jobs:
            resolved = loaded.resolve_job_def(job.name)
            assert resolved.graph.node_named(spec.config_op) is not None or any(
                node.name == spec.config_op for node in resolved.graph.iterate_op_defs()
            ), (job.name, spec.config_op)
        assert spec.config.from_values(None).to_settings() is not None, spec.name
        for name in spec.job_names:
            assert PROJECT.spec_for(name) is spec
    with pytest.raises(ConfigError) as info:
        PROJECT.spec_for("no_such_job")
    assert info.value.field == "job" and "customer_status_sweep_job" in str(info.value)


def test_field_bounds_live_on_the_settings_model_and_to_settings_enforces_them() -> None:
    """Bounds live on the settings model only: the run config carries the model's default and description
    (bounds shown), and to_settings() refuses a bad value however the config was built (from values, plain
    construction, model_construct as an older run config), naming the field; 0 is a value, not the default."""
    assert ToyConfig().to_settings() == ToySettings(limit=10)
    assert "1..1000" in ToyConfig.model_fields["limit"].description
    with pytest.raises(ConfigError) as info:
        ToyConfig.from_values({"limit": -1}).to_settings()
    assert info.value.field == "limit"
    for bad in (1001, -1, 0, True, "5 "):
        with pytest.raises(ConfigError) as info:
            ToyConfig.model_construct(limit=bad).to_settings()
        assert info.value.field == "limit", bad


@pytest.fixture
def toy_project() -> Iterator[None]:
    """This repository's project with one more job: this module's SPEC (the toy job)."""
    use(dataclasses.replace(PROJECT, job_modules={**PROJECT.job_modules, __name__: ("toy_count_job",)}))
    try:
        yield
    finally:
        use(PROJECT)


SPEC = TOY


def test_a_new_job_is_one_spec_in_the_project(dagster_env: Settings, engine: sa.Engine, seeded: int,
                                              toy_project: None) -> None:
    """With one more module in the project's jobs, the job is launched by name with its config (validated, exit-2
    errors naming the field), runs as a Dagster run, and its summary comes back; no other table is edited."""
    assert get_job("toy_count_job").name == "toy_count_job"
    assert build_run_config(TOY, ToyConfig(limit=5))["ops"] == {"count_customers": {"config": {"limit": 5}}}
    with pytest.raises(ConfigError) as info:
        launch_job("toy_count_job", {"limit": 5000}, settings=dagster_env)
    assert info.value.field == "limit"
    with pytest.raises(ConfigError) as info:  # an object a library caller built without validation
        launch_job("toy_count_job", ToyConfig.model_construct(limit=5000), settings=dagster_env)
    assert info.value.field == "limit"

    result = launch_job("toy_count_job", {"limit": 25}, settings=dagster_env)
    assert result.dagster_status == "SUCCESS"
    assert result.summary["status"] == "SUCCESS" and result.summary["scanned"] == 25 <= seeded
    assert run_history.latest(engine, result.run_id)["scanned"] == 25
