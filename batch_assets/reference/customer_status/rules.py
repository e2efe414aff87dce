"""The age-category rule (docs/reference/rules.md), as pure functions of explicit dates.

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

from batch_assets import ConfigError

SENTINEL = date(9999, 12, 31)
"""`next_review_date` of a row whose category can never change again."""

_AGE_RE = re.compile(r"[0-9]{1,3}", re.ASCII)
MAX_CATEGORY_LENGTH = 63
_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*", re.ASCII)
MAX_MIN_AGE = 130
"""Rule ages are at most 130 (docs/reference/rules.md)."""


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
        """Rules from (category, min_age) pairs, taken as they are: `validate` refuses a non-text name or a
        min_age that is not a whole number (int() would read True as 1 and ' 18' as 18)."""
        return cls(tuple(Rule(name, age) for name, age in pairs))

    @classmethod
    def parse(cls, text: str) -> Rules:
        """Parse `NAME=AGE,NAME=AGE,...` as the whole list (the `rules set --replace --thresholds` syntax)."""
        return cls.from_pairs(parse_pairs(text))

    def merged(self, text: str) -> Rules:
        """These rules with the `NAME=AGE,...` of `text` merged in (`rules set --thresholds`).

        A NAME that is a category here gets the new age in its place; the others keep theirs. A new NAME
        is added where its age falls. The entries of `text` are listed youngest first, like a rule list;
        the result is validated as a whole (`validate`: starts at 0, strictly increasing, at most 130), so
        a change that would reorder the categories is refused, naming `thresholds`."""
        pairs = parse_pairs(text)
        for name, _ in pairs:
            _check_category(name)
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ConfigError("category names must be unique", field="thresholds")
        for (before, young), (after, old) in zip(pairs, pairs[1:], strict=False):
            if old <= young:
                raise ConfigError(f"ages must be strictly increasing, got {before}={young} then {after}={old}",
                                  field="thresholds")
        given = dict(pairs)
        kept = [Rule(r.category, given.pop(r.category, r.min_age)) for r in self.rules]
        validate(kept)  # an existing category moved past its neighbour: refused here, before new ones fit in
        added = [Rule(name, age) for name, age in given.items()]
        return Rules(tuple(sorted(kept + added, key=lambda r: r.min_age)))

    def changes_from(self, old: Rules) -> str:
        """What differs from `old`, for people: `YOUNG_ADULT 18->21, ELDER added (90), ...` or `no change`."""
        before = {r.category: r.min_age for r in old.rules}
        after = {r.category: r.min_age for r in self.rules}
        parts = [f"{name} {before[name]}->{age}" for name, age in after.items()
                 if name in before and before[name] != age]
        parts += [f"{name} added ({age})" for name, age in after.items() if name not in before]
        parts += [f"{name} removed" for name in before if name not in after]
        return ", ".join(parts) or "no change"

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


def parse_pairs(text: str) -> list[tuple[str, int]]:
    """`NAME=AGE,NAME=AGE,...` as (name, age) pairs, each entry well formed (ConfigError naming `thresholds`);
    whether they make a valid rule list is `validate`'s question."""
    pairs: list[tuple[str, int]] = []
    if not text.strip():
        raise ConfigError(f"must not be empty, got {text!r} (expected NAME=AGE,NAME=AGE,...)", field="thresholds")
    for part in (p.strip() for p in text.split(",")):
        if not part:  # "MINOR=0,$UNSET" or a doubled comma: not a rule the operator meant to drop
            raise ConfigError(f"empty entry in {text!r} (expected NAME=AGE,NAME=AGE,...)", field="thresholds")
        name, sep, age = part.partition("=")
        # ASCII digits only: str.isdigit() also takes '²' and '１８', which int() then rejects or reads.
        if not sep or not _AGE_RE.fullmatch(age.strip()):
            raise ConfigError(f"{part!r} is not NAME=AGE (AGE in ASCII digits, e.g. ADULT=26)", field="thresholds")
        pairs.append((name.strip(), int(age.strip())))
    return pairs


def validate(rules: Sequence[Rule]) -> None:
    """The rules (docs/reference/rules.md): an ordered list, the first with min_age 0, ages strictly increasing and
    at most 130;
    each category 1..63 characters, an upper-case letter then upper-case letters, digits or _, unique.

    The one check of every path that makes Rules (CLI, Dagster, library, rules read back from ba_rules),
    so rules that break it are never stored nor used; ConfigError names `thresholds` (exit 2).
    """
    if not rules:
        raise ConfigError("at least one rule is required", field="thresholds")
    for rule in rules:
        _check_category(rule.category)
        if isinstance(rule.min_age, bool) or not isinstance(rule.min_age, int):
            raise ConfigError(f"min_age of {rule.category} must be a whole number, got {rule.min_age!r}",
                              field="thresholds")
    if rules[0].min_age != 0:
        raise ConfigError(f"the first rule must have min_age 0, got {rules[0].category}={rules[0].min_age}",
                          field="thresholds")
    names = [r.category for r in rules]
    if len(set(names)) != len(names):
        raise ConfigError("category names must be unique", field="thresholds")
    for rule in rules:
        if not 0 <= rule.min_age <= MAX_MIN_AGE:
            raise ConfigError(f"ages must be between 0 and {MAX_MIN_AGE}, got {rule.category}={rule.min_age}",
                              field="thresholds")
    for before, after in zip(rules, rules[1:], strict=False):
        if after.min_age <= before.min_age:
            raise ConfigError(f"ages must be strictly increasing, got {before.category}={before.min_age} "
                              f"then {after.category}={after.min_age}", field="thresholds")


def _check_category(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a category name must be a non-empty text, got {name!r}", field="thresholds")
    shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}..."
    if len(name) > MAX_CATEGORY_LENGTH:
        raise ConfigError(f"category {shown} is {len(name)} characters long; at most {MAX_CATEGORY_LENGTH}",
                          field="thresholds")
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(f"category {shown} must start with an upper-case letter, followed by upper-case "
                          f"letters, digits or _ (at most {MAX_CATEGORY_LENGTH} characters)", field="thresholds")


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


_DOB_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
"""Exactly YYYY-MM-DD in ASCII digits (a [0-9] class matches ASCII only; fullmatch refuses a trailing newline)."""


def parse_dob(text: str) -> date:
    """Parse the strict `YYYY-MM-DD` plaintext in ASCII digits; raises ValueError otherwise.

    int() alone would take ' 990', '1_90', '+990' and non-ASCII digits such as '١٩٩٠'; year 0000 and
    dates that do not exist (29 February of a common year) are refused by date()."""
    if _DOB_TEXT.fullmatch(text) is None:
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
