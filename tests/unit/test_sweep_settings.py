"""SweepSettings: zero/None means default, invalid values are ConfigError naming the field."""

from __future__ import annotations

import pytest

from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import ConfigError

pytestmark = pytest.mark.unit


def test_zero_and_none_mean_the_default() -> None:
    """0 and None fall back to the documented defaults."""
    assert SweepSettings.build(page_size=0, workers=None, window=0, page_timeout_s=0) == SweepSettings()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"page_size": 10_001}, "page_size"),
        ({"page_size": -5}, "page_size"),
        ({"workers": -1}, "workers"),
        ({"window": "3"}, "window"),
        ({"page_timeout_s": -1.0}, "page_timeout_s"),
        ({"breaker_ratio": 1.5}, "breaker_ratio"),
        ({"row_timeout_s": 60}, "row_timeout_s"),
        ({"workers": 8}, "pool_size"),
        ({"workers": 4, "pool_size": 6}, "pool_size"),
        ({"no_such_knob": 1}, "no_such_knob"),
    ],
)
def test_invalid_values_name_their_field(kwargs: dict, field: str) -> None:
    """Each invalid value raises ConfigError whose field names it (page_size over 1000 is never clamped)."""
    with pytest.raises(ConfigError) as info:
        SweepSettings.build(**kwargs)
    assert info.value.field == field


def test_connection_budget_fits_exactly() -> None:
    """workers + prefetch + side-effect + heartbeat may use the whole pool, not more."""
    assert SweepSettings.build(workers=7, pool_size=10).connections_needed == 10


def test_a_definition_may_allow_larger_pages() -> None:
    """Settings are built up to the absolute page bound; validate(max_page_size=...) is a sweep's own bound
    (run_sweep checks SweepDefinition.max_page_size, 1,000 by default)."""
    settings = SweepSettings(page_size=5000)
    with pytest.raises(ConfigError) as info:
        settings.validate()
    assert info.value.field == "page_size"
    settings.validate(max_page_size=10_000)
    with pytest.raises(ConfigError):
        settings.validate(max_page_size=4999)
    with pytest.raises(ConfigError) as info:
        SweepSettings(page_size=10_001)
    assert info.value.field == "page_size"

