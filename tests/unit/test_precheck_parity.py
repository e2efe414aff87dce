"""Parity of the config-change pre-check with the full evaluation, over a grid of boundary cases."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from batch_assets.reference.customer_status.rules import (
    DEFAULT_RULES,
    SENTINEL,
    Rules,
    date_reaching_age,
    evaluate,
    needs_evaluation,
)

pytestmark = pytest.mark.unit

RUN_DATES = [date(2025, 6, 1), date(2024, 2, 29), date(2024, 3, 1), date(2023, 2, 28), date(2023, 3, 1)]
NEW_RULES = [
    DEFAULT_RULES,
    Rules.parse("MINOR=0,YOUNG_ADULT=21,ADULT=26,SENIOR=65"),
    Rules.parse("MINOR=0,YOUNG_ADULT=18,ADULT=25,SENIOR=65"),
    Rules.parse("MINOR=0,YOUNG_ADULT=18,ADULT=26,SENIOR=67"),
    Rules.parse("MINOR=0,YOUNG_ADULT=18,ADULT=26,SENIOR=60"),
    Rules.parse("MINOR=0,YOUNG_ADULT=18,ADULT=26,SENIOR=65,ELDER=80"),
    Rules.parse("MINOR=0,YOUNG_ADULT=18,SENIOR=65"),
    Rules.parse("MINOR=0,YOUNG=18,ADULT=26,SENIOR=65"),
    Rules.parse("MINOR=0,ADULT=18"),
]


def _shift(day: date, years: int) -> date:
    try:
        return day.replace(year=day.year - years)
    except ValueError:  # 29 February → 28 February
        return day.replace(year=day.year - years, day=28)


def _grid_dobs(run_date: date, ages: set[int]) -> set[date]:
    dobs = {run_date, date(2000, 2, 29), date(1996, 2, 29), date(1960, 2, 29), date(1959, 3, 1), date(2001, 3, 1)}
    for age in ages | {0, 1, 30, 70, 81, 100}:
        base = _shift(run_date, age)
        dobs |= {base + timedelta(days=d) for d in (-2, -1, 0, 1, 2)}
        for year in (run_date.year - age - 1, run_date.year - age):
            dobs |= {date(year, 2, 28), date(year, 3, 1)}
            if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
                dobs.add(date(year, 2, 29))
    return {d for d in dobs if d <= run_date}


def _changed(dob: date, run_date: date, rules: Rules, stored: tuple[str, date]) -> bool:
    result = evaluate(dob, run_date, rules)
    return (result.category, result.next_review_date) != stored


def _consistent_dobs(stored: tuple[str, date], run_date: date, old: Rules) -> list[date]:
    """Every date of birth (brute force) the old rules map to this stored (category, next_review_date)."""
    category, next_review = stored
    index = old.index_of(category)
    if next_review == SENTINEL:
        lo = old.rules[index].min_age
        candidates = [_shift(run_date, a) + timedelta(days=d) for a in range(lo, 121) for d in (-1, 0, 1)]
    else:
        age = old.rules[index + 1].min_age
        base = _shift(next_review, age)
        candidates = [base + timedelta(days=d) for d in range(-3, 4)]
    found = []
    for d in candidates:
        if d <= run_date:
            result = evaluate(d, run_date, old)
            if (result.category, result.next_review_date) == stored:
                found.append(d)
    return found


def _grid() -> list[tuple[date, Rules, date, tuple[str, date]]]:
    cases = []
    for run_date in RUN_DATES:
        for new in NEW_RULES:
            ages = {r.min_age for r in DEFAULT_RULES.rules} | {r.min_age for r in new.rules}
            for dob in sorted(_grid_dobs(run_date, ages)):
                stored = evaluate(dob, run_date, DEFAULT_RULES)
                cases.append((run_date, new, dob, (stored.category, stored.next_review_date)))
    return cases


def test_pre_check_equals_would_change_wherever_the_projection_decides() -> None:
    """pre_check(row) == (evaluate changes something) for every row whose narrow projection fixes the answer."""
    decided = {True: 0, False: 0}
    undecidable = 0
    for run_date, new, dob, stored in _grid():
        pre = needs_evaluation(stored[0], stored[1], run_date, DEFAULT_RULES, new)
        changed = _changed(dob, run_date, new, stored)
        assert pre or not changed, (run_date, str(new), dob)  # never skip a row that changes
        answers = {_changed(d, run_date, new, stored) for d in _consistent_dobs(stored, run_date, DEFAULT_RULES)}
        if len(answers) == 1:
            assert pre == changed, (run_date, str(new), dob, stored)
            decided[pre] += 1
        else:
            undecidable += 1
    assert decided[True] > 200 and decided[False] > 200, decided
    assert undecidable < decided[True] + decided[False], undecidable


def test_identical_rules_skip_every_settled_row() -> None:
    """With unchanged rules nothing settled needs evaluation (the whole grid, including 29 February rows)."""
    for run_date in RUN_DATES:
        for dob in _grid_dobs(run_date, {18, 26, 65}):
            stored = evaluate(dob, run_date, DEFAULT_RULES)
            assert not needs_evaluation(stored.category, stored.next_review_date, run_date, DEFAULT_RULES,
                                        DEFAULT_RULES), (run_date, dob)


@pytest.mark.parametrize(
    ("category", "next_review"),
    [(None, None), ("ADULT", None), (None, date(2030, 1, 1)), ("ADULT", date(2025, 6, 1)), ("ADULT", date(2025, 5, 1))],
)
def test_unsettled_rows_always_need_evaluation(category: str | None, next_review: date | None) -> None:
    """NULL category or date, or a date on/before the run date, always needs the full evaluation."""
    assert needs_evaluation(category, next_review, date(2025, 6, 1), DEFAULT_RULES, DEFAULT_RULES)


def test_rows_not_explained_by_the_old_rules_need_evaluation() -> None:
    """A stored state the old rules could not have produced (unknown category, impossible date) is evaluated."""
    run_date = date(2025, 6, 1)
    assert needs_evaluation("UNKNOWN", date(2030, 1, 1), run_date, DEFAULT_RULES, DEFAULT_RULES)
    # ADULT reviewed in 2100 would be age < 26 today: inconsistent with ADULT.
    assert needs_evaluation("ADULT", date(2100, 1, 1), run_date, DEFAULT_RULES, DEFAULT_RULES)
    # MINOR with the sentinel cannot come from the default rules.
    assert needs_evaluation("MINOR", SENTINEL, run_date, DEFAULT_RULES, DEFAULT_RULES)
    assert needs_evaluation("ADULT", date_reaching_age(date(1990, 1, 1), 65), run_date, None, DEFAULT_RULES)
