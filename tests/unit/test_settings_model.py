"""One source of truth per job's settings: the run config and the CLI options derive from the settings model."""

from __future__ import annotations

import argparse
import enum

import pytest

from batch_assets.cli.args import Parser, UsageError, add_setting
from batch_assets.errors import ConfigError
from batch_assets.orchestration.retention_job import RetentionConfig
from batch_assets.reference.customer_status.dagster import SweepConfig
from batch_assets.reference.customer_status.job import CustomerStatusSettings
from batch_assets.retention.prune import RetentionSettings

pytestmark = pytest.mark.unit


def test_the_launchpad_fields_are_the_models_fields_with_its_defaults_and_words() -> None:
    """Every model field is a config field with the model's default and its description (bounds included)."""
    model = CustomerStatusSettings.model_fields
    config = SweepConfig.model_fields
    assert set(config) == set(model)
    assert config["workers"].default == model["workers"].default == 4
    assert config["workers"].description.startswith(model["workers"].description)
    assert "1..32" in config["workers"].description and "Default 4" in config["workers"].description
    assert config["run_date"].default is None and config["pool_size"].default is None


def test_a_literal_of_modes_is_a_config_enum_and_comes_first() -> None:
    """The launchpad gets the modes as an Enum (it refuses any other value); the job's own fields lead."""
    mode = SweepConfig.model_fields["mode"]
    assert isinstance(mode.annotation, enum.EnumMeta)
    assert [m.value for m in mode.annotation] == ["delta", "full", "config-change"]
    assert mode.default.value == "delta"
    assert list(SweepConfig.model_fields).index("mode") < list(SweepConfig.model_fields).index("workers")


def test_to_settings_is_the_model_and_the_bounds_live_only_there() -> None:
    """The config holds no bounds of its own: building it accepts 100000 workers, the model refuses them."""
    settings = SweepConfig(mode="full", workers=8).to_settings()
    assert isinstance(settings, CustomerStatusSettings)
    assert (settings.mode, settings.workers, settings.pool_size, settings.ranges) == ("full", 8, 11, 4)
    loose = SweepConfig(workers=100_000)
    with pytest.raises(ConfigError) as info:
        loose.to_settings()
    assert info.value.field == "workers" and "at most 32" in str(info.value)


def test_a_config_may_expose_a_subset_of_the_model() -> None:
    """`fields=` keeps the others at the model's default (the expiry's lock knobs are not run config)."""
    from batch_assets.reference.subscriptions.dagster import ExpiryConfig

    assert set(ExpiryConfig.model_fields) == {"run_date", "allow_distant_run_date", "retry_failed", "batch_size",
                                              "max_retries"}
    assert ExpiryConfig(batch_size=7).to_settings().engine.lock_ttl_s == 120
    assert set(RetentionConfig.model_fields) == set(RetentionSettings.model_fields)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="test")
    add_setting(parser, CustomerStatusSettings, "mode")
    add_setting(parser, CustomerStatusSettings, "page_size")
    add_setting(parser, CustomerStatusSettings, "lock_fail_open")
    return parser


def test_cli_options_derive_from_the_same_fields() -> None:
    """--page-size takes the model's bound (1000 for this sweep), --mode its choices, a flag is store_true;
    --help shows the field's description."""
    parser = _parser()
    args = parser.parse_args(["--mode", "full", "--page-size", "1000", "--lock-fail-open"])
    assert (args.mode, args.page_size, args.lock_fail_open) == ("full", 1000, True)
    assert parser.parse_args([]).page_size is None  # not given: the model's default applies
    for bad in (["--page-size", "1001"], ["--page-size", "1_000"], ["--mode", "weekly"], ["--page-size", ""]):
        with pytest.raises(UsageError):
            parser.parse_args(bad)
    assert "Rows per page" in parser.format_help()
