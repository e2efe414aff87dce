"""SweepSettings: one typed model; every invalid value is a ConfigError naming the field."""

from __future__ import annotations

import pytest

from batch_assets.engine.settings import SweepSettings
from batch_assets.errors import ConfigError

pytestmark = pytest.mark.unit


def test_the_defaults_are_the_fields_defaults_and_the_pool_follows_the_workers() -> None:
    """Nothing given: the documented defaults; the pool defaults to max(10, workers + 3)."""
    settings = SweepSettings()
    assert (settings.page_size, settings.workers, settings.window, settings.pool_size) == (1000, 4, 3, 10)
    assert SweepSettings(workers=12).pool_size == 15


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"page_size": 10_001}, "page_size"),
        ({"page_size": -5}, "page_size"),
        ({"page_size": 0}, "page_size"),
        ({"workers": -1}, "workers"),
        ({"workers": 2.0}, "workers"),
        ({"window": "3"}, "window"),
        ({"page_timeout_s": -1.0}, "page_timeout_s"),
        ({"page_timeout_s": float("nan")}, "page_timeout_s"),
        ({"breaker_ratio": 1.5}, "breaker_ratio"),
        ({"lock_fail_open": "yes"}, "lock_fail_open"),
        ({"row_timeout_s": 60}, "row_timeout_s"),
        ({"heartbeat_s": 60}, "heartbeat_s"),
        ({"workers": 8, "pool_size": 10}, "pool_size"),
        ({"workers": 4, "pool_size": 6}, "pool_size"),
        ({"no_such_knob": 1}, "no_such_knob"),
    ],
)
def test_invalid_values_name_their_field(kwargs: dict, field: str) -> None:
    """Each invalid value raises ConfigError whose field names it (a page over the bound is never clamped)."""
    with pytest.raises(ConfigError) as info:
        SweepSettings(**kwargs)
    assert info.value.field == field


def test_connection_budget_fits_exactly() -> None:
    """workers + prefetch + side-effect + heartbeat may use the whole pool, not more."""
    assert SweepSettings(workers=7, pool_size=10).connections_needed == 10


def test_settings_are_frozen() -> None:
    """A SweepSettings is valid wherever it travels: nothing changes it after it was built."""
    settings = SweepSettings()
    with pytest.raises(Exception, match="frozen"):
        settings.workers = 1000  # type: ignore[misc]


def test_every_knob_has_a_description_and_bounds() -> None:
    """The launchpad and --help derive from the fields: none may be left without its words."""
    for name, info in SweepSettings.model_fields.items():
        assert info.description, name
