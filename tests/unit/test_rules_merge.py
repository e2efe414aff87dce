"""`rules set --thresholds` merges onto the rules in force: one threshold alone changes that rule."""

from __future__ import annotations

import pytest

from batch_assets.errors import ConfigError
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, Rules


def test_one_threshold_changes_that_rule_and_keeps_the_others() -> None:
    merged = DEFAULT_RULES.merged("YOUNG_ADULT=21")
    assert str(merged) == "MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=65"
    assert merged.changes_from(DEFAULT_RULES) == "YOUNG_ADULT 18->21"


def test_a_new_name_is_added_where_its_age_falls() -> None:
    assert str(DEFAULT_RULES.merged("ELDER=90")) == "MINOR=0,YOUNG_ADULT=18,ADULT=26,SENIOR=65,ELDER=90"
    assert str(DEFAULT_RULES.merged("TEEN=13")) == "MINOR=0,TEEN=13,YOUNG_ADULT=18,ADULT=26,SENIOR=65"


def test_the_whole_list_merged_is_that_list() -> None:
    text = "MINOR=0,YOUNG_ADULT=21,ADULT=30,SENIOR=67"
    assert DEFAULT_RULES.merged(text) == Rules.parse(text)


@pytest.mark.parametrize(("text", "message"), [
    ("YOUNG_ADULT=30", "got YOUNG_ADULT=30 then ADULT=26"),  # would move past ADULT
    ("MINOR=5", "the first rule must have min_age 0"),
    ("SENIOR=131", "between 0 and 130"),
    ("ELDER=65", "got SENIOR=65 then ELDER=65"),  # a tie with an existing rule
    ("ADULT=26,YOUNG_ADULT=18", "got ADULT=26 then YOUNG_ADULT=18"),  # not youngest first
    ("ADULT=30,ADULT=31", "unique"),
    ("YOUNG_ADULT=２１", "not NAME=AGE"),
    ("young=21", "upper-case"),
])
def test_a_merge_is_validated_as_a_whole_and_names_thresholds(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        DEFAULT_RULES.merged(text)
    assert raised.value.field == "thresholds"
