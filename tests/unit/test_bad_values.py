"""Bad values refused on the library and Dagster paths too, not only by the CLI (docs/reference/cli.md,
docs/reference/rules.md)."""

from __future__ import annotations

import pytest

from batch_assets.errors import ConfigError
from batch_assets.reference.customer_status.dagster import SweepConfig
from batch_assets.reference.customer_status.rules import Rules

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("pairs", [
    [("MINOR", 0), ("YOUNG_ADULT", 18), ("ADULT", 200)],
    [("MINOR", 0), ("ADULT", True)],
    [("MINOR", 0), ("ADULT\n", 18)],
])
def test_rules_built_by_a_library_caller_are_held_to_section_5(pairs) -> None:
    """Rules.from_pairs (what set_rules and ba_rules reads use) refuses what `rules set` refuses."""
    with pytest.raises(ConfigError) as info:
        Rules.from_pairs(pairs)
    assert info.value.field == "thresholds"


@pytest.mark.parametrize("run_date", ["", " ", " 2026-01-01", "2026-01-01 "])
def test_a_dagster_config_refuses_an_empty_or_loose_run_date(run_date: str) -> None:
    """SweepConfig as the launchpad builds it: '' is not today, and the text must be exactly YYYY-MM-DD."""
    with pytest.raises(ConfigError) as info:
        SweepConfig(mode="full", run_date=run_date).to_settings()
    assert info.value.field == "run_date"
    with pytest.raises(ConfigError) as info:
        SweepConfig.model_construct(mode="full", run_date=run_date).to_settings()
    assert info.value.field == "run_date"


@pytest.mark.parametrize(("field", "value"), [
    ("workers", " 2"), ("workers", "+2"), ("workers", "1_0"), ("workers", 2.0), ("workers", True),
    ("lock_fail_open", "yes"), ("lock_fail_open", 1), ("page_timeout_s", "1_0"), ("page_timeout_s", " 2"),
])
def test_from_values_refuses_what_pydantic_would_coerce(field: str, value: object) -> None:
    """JobConfig.from_values: no lax coercion of strings, floats or bools into another field type."""
    with pytest.raises(ConfigError) as info:
        SweepConfig.from_values({"mode": "full", field: value})
    assert info.value.field == field
    assert SweepConfig.from_values({"mode": "full", "workers": "2", "page_timeout_s": "2.5"}).workers == 2
