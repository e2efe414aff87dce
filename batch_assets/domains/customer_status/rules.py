"""The age-category rule of CONTRACT §5, as pure functions of explicit dates.

Nothing here reads the clock: the run date is always an argument.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from batch_assets.errors import ConfigError

SENTINEL = date(9999, 12, 31)
"""`next_review_date` of a row whose category can never change again."""

_AGE_RE = re.compile(r"[0-9]{1,3}", re.ASCII)
_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,62}$")


@dataclass(frozen=True)
class Rule:
    category: str
    min_age: int


@dataclass(frozen=True)
class Rules:
    """An ordered list of (category, min_age), the first with min_age 0."""

    rules: tuple[Rule, ...]

    def __post_init__(self) -> None:
        validate(self.rules)

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[str, int]]) -> Rules:
        return cls(tuple(Rule(str(name), int(age)) for name, age in pairs))

    @classmethod
    def parse(cls, text: str) -> Rules:
        """Parse `NAME=AGE,NAME=AGE,...` (the `rules set --thresholds` syntax)."""
        pairs: list[tuple[str, int]] = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            name, sep, age = part.partition("=")
            # ASCII digits only: str.isdigit() also takes '²' and '１８', which int() then rejects or reads.
            if not sep or not _AGE_RE.fullmatch(age.strip()):
                raise ConfigError(f"{part!r} is not NAME=AGE (AGE in ASCII digits, e.g. ADULT=26)", field="thresholds")
            pairs.append((name.strip(), int(age.strip())))
        return cls.from_pairs(pairs)

    def to_json(self) -> list[list[str | int]]:
        return [[r.category, r.min_age] for r in self.rules]

    @property
    def fingerprint(self) -> str:
        canonical = json.dumps(self.to_json(), separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def index_for_age(self, age: int) -> int:
        """Index of the last rule whose min_age <= age."""
        index = 0
        for i, rule in enumerate(self.rules):
            if rule.min_age <= age:
                index = i
            else:
                break
        return index

    def index_of(self, category: str | None) -> int | None:
        for i, rule in enumerate(self.rules):
            if rule.category == category:
                return i
        return None

    def __str__(self) -> str:
        return ",".join(f"{r.category}={r.min_age}" for r in self.rules)


def validate(rules: Sequence[Rule]) -> None:
    if not rules:
        raise ConfigError("at least one rule is required", field="thresholds")
    if rules[0].min_age != 0:
        raise ConfigError("the first rule must have min_age 0", field="thresholds")
    names = [r.category for r in rules]
    for name in names:
        if not _NAME_RE.match(name):
            raise ConfigError(f"category {name!r} must be upper-case letters, digits or _", field="thresholds")
    if len(set(names)) != len(names):
        raise ConfigError("category names must be unique", field="thresholds")
    ages = [r.min_age for r in rules]
    if any(a < 0 or a > 200 for a in ages):
        raise ConfigError("ages must be between 0 and 200", field="thresholds")
    if any(b <= a for a, b in zip(ages, ages[1:], strict=False)):
        raise ConfigError("ages must be strictly increasing", field="thresholds")


DEFAULT_RULES = Rules.from_pairs([("MINOR", 0), ("YOUNG_ADULT", 18), ("ADULT", 26), ("SENIOR", 65)])


def birthday_in_year(dob: date, year: int) -> date:
    """The day in `year` on which the person completes another year.

    Someone born on 29 February does so on 1 March in common years.
    """
    if dob.month == 2 and dob.day == 29 and not calendar.isleap(year):
        return date(year, 3, 1)
    return dob.replace(year=year)


def age_on(dob: date, day: date) -> int:
    """Whole years completed on `day`."""
    years = day.year - dob.year
    return years - 1 if day < birthday_in_year(dob, day.year) else years


def date_reaching_age(dob: date, age: int) -> date:
    """The date on which `age` is reached; `SENTINEL` if beyond the calendar."""
    year = dob.year + age
    if year > SENTINEL.year:
        return SENTINEL
    return birthday_in_year(dob, year)


@dataclass(frozen=True)
class Evaluation:
    category: str
    next_review_date: date
    category_since: date
    """The date on which `category` began (the trigger's effective_date)."""


def evaluate(dob: date, run_date: date, rules: Rules) -> Evaluation:
    """Category on the run date, when it next changes, and since when it holds.

    The caller guarantees dob <= run_date (a later dob is an invalid value).
    """
    index = rules.index_for_age(age_on(dob, run_date))
    current = rules.rules[index]
    if index + 1 < len(rules.rules):
        next_review = date_reaching_age(dob, rules.rules[index + 1].min_age)
    else:
        next_review = SENTINEL
    return Evaluation(current.category, next_review, date_reaching_age(dob, current.min_age))


def parse_dob(text: str) -> date:
    """Parse the strict `YYYY-MM-DD` plaintext; raises ValueError otherwise."""
    if len(text) != 10 or text[4] != "-" or text[7] != "-":
        raise ValueError("not YYYY-MM-DD")
    return date(int(text[0:4]), int(text[5:7]), int(text[8:10]))


# Config-change pre-check -------------------------------------------------------


def next_min_age(rules: Rules, index: int) -> int | None:
    """min_age of the rule after `index`, None for the last rule."""
    return rules.rules[index + 1].min_age if index + 1 < len(rules.rules) else None


def candidate_dobs(next_review: date, age: int) -> tuple[date, ...]:
    """Every date of birth that reaches `age` on `next_review` (two for a 1 March after 29 February)."""
    year = next_review.year - age
    if year < 1:
        return ()
    candidates = []
    for month, day in ((next_review.month, next_review.day), (2, 29)):
        try:
            dob = date(year, month, day)
        except ValueError:
            continue
        if dob not in candidates and date_reaching_age(dob, age) == next_review:
            candidates.append(dob)
    return tuple(candidates)


def needs_evaluation(
    stored_category: str | None, stored_next_review: date | None, run_date: date, old: Rules | None, new: Rules
) -> bool:
    """Config-change pre-check on the narrow projection: True = the row needs the full evaluation.

    False only when the stored (category, next_review_date), settled under the
    `old` rules, provably equals what `evaluate` gives under the `new` rules. Uses
    the same helpers as `evaluate` (age_on, date_reaching_age, index_for_age), so
    the two cannot disagree; undecidable cases answer True (evaluate).
    """
    if old is None or stored_category is None or stored_next_review is None or stored_next_review <= run_date:
        return True  # not settled: NULLs, or due today or earlier
    old_index = old.index_of(stored_category)
    new_index = new.index_of(stored_category)
    if old_index is None or new_index is None:
        return True
    old_next = next_min_age(old, old_index)
    if old_next != next_min_age(new, new_index):
        return True  # a different next threshold means a different next_review_date
    if old_next is None:
        # Final category under both: stored as the sentinel; only "age >= old min" is known.
        if stored_next_review != SENTINEL:
            return True
        return new.rules[new_index].min_age > old.rules[old_index].min_age
    dobs = [dob for dob in candidate_dobs(stored_next_review, old_next) if dob <= run_date]
    if not dobs:
        return True
    for dob in dobs:
        age = age_on(dob, run_date)
        if old.index_for_age(age) != old_index or new.index_for_age(age) != new_index:
            return True  # not what the old rules would have stored, or the category moves
    return False
