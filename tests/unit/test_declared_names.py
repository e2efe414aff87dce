"""A sweep and a queue check their name and their `module:function` by one rule, and say it the same way."""

from __future__ import annotations

import pydantic
import pytest

from batch_assets import QueueDeclaration, SweepComponent

pytestmark = pytest.mark.unit

SWEEP = {"name": "tiers", "table": "accounts", "key": "id", "columns": ["id", "spend", "tier"],
         "compute": "tiers:compute", "writes": ["tier"]}
QUEUE = {"name": "emails", "table": "emails", "key": "id", "columns": ["address"], "handler": "mail:send"}


def refusal(model: type[pydantic.BaseModel], attributes: dict[str, object]) -> str:
    with pytest.raises(pydantic.ValidationError) as caught:
        model.model_validate(attributes)
    [error] = caught.value.errors()
    return f"{error['loc'][0]}: {error['msg'].removeprefix('Value error, ')}"


@pytest.mark.parametrize("name", ["Tiers", "9tiers", "tiers-daily", "t" * 42, "tiers;drop", ""])
def test_a_name_out_of_the_rule_is_refused_alike(name: str) -> None:
    expected = f"name: must match [a-z][a-z0-9_]{{0,40}}, got {name!r}"
    assert refusal(SweepComponent, {**SWEEP, "name": name}) == expected
    assert refusal(QueueDeclaration, {**QUEUE, "name": name}) == expected


@pytest.mark.parametrize("function", ["tiers", "tiers:", ":compute", "tiers:compute()", "os:system; rm", "a b:c"])
def test_a_function_that_is_not_module_function_is_refused_alike(function: str) -> None:
    assert refusal(SweepComponent, {**SWEEP, "compute": function}) == \
        f"compute: must be module:function, got {function!r}"
    assert refusal(QueueDeclaration, {**QUEUE, "handler": function}) == \
        f"handler: must be module:function, got {function!r}"


def test_a_method_and_surrounding_spaces_are_accepted() -> None:
    assert SweepComponent.model_validate({**SWEEP, "compute": " tiers:Rules.compute "}).compute == "tiers:Rules.compute"
    assert QueueDeclaration.model_validate({**QUEUE, "handler": " mail:Mailer.send "}).handler == "mail:Mailer.send"
