"""The age-category rule (docs/reference/rules.md) and the sweep's per-row compute."""

from __future__ import annotations

import uuid
from datetime import date, timedelta

import pytest

from batch_assets.errors import ConfigError
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.rules import (
    DEFAULT_RULES,
    SENTINEL,
    Rules,
    age_on,
    date_reaching_age,
    evaluate,
    parse_dob,
)
from batch_assets.reference.customer_status.sweep import CustomerStatusSweep

pytestmark = pytest.mark.unit

RUN_DATE = date(2025, 6, 1)


def _years_before(day: date, years: int) -> date:
    return day.replace(year=day.year - years)


@pytest.mark.parametrize(
    ("threshold", "below", "at"),
    [(18, "MINOR", "YOUNG_ADULT"), (26, "YOUNG_ADULT", "ADULT"), (65, "ADULT", "SENIOR")],
)
def test_each_threshold_minus_one_exact_plus_one_day(threshold: int, below: str, at: str) -> None:
    """A threshold is crossed on the birthday: the day before is the lower category, the day and after the higher."""
    exact = _years_before(RUN_DATE, threshold)
    assert evaluate(exact + timedelta(days=1), RUN_DATE, DEFAULT_RULES).category == below
    assert evaluate(exact, RUN_DATE, DEFAULT_RULES).category == at
    assert evaluate(exact - timedelta(days=1), RUN_DATE, DEFAULT_RULES).category == at
    day_before = evaluate(exact + timedelta(days=1), RUN_DATE, DEFAULT_RULES)
    assert day_before.next_review_date == RUN_DATE + timedelta(days=1)
    on_the_day = evaluate(exact, RUN_DATE, DEFAULT_RULES)
    assert on_the_day.category_since == RUN_DATE


def test_29_february_birthday_in_common_and_leap_years() -> None:
    """Born on 29 February: a year is completed on 1 March in common years and on 29 February in leap years."""
    dob = date(2000, 2, 29)
    assert age_on(dob, date(2018, 2, 28)) == 17
    assert age_on(dob, date(2018, 3, 1)) == 18
    assert age_on(dob, date(2024, 2, 28)) == 23
    assert age_on(dob, date(2024, 2, 29)) == 24
    assert date_reaching_age(dob, 18) == date(2018, 3, 1)
    assert date_reaching_age(dob, 20) == date(2020, 2, 29)
    assert evaluate(dob, date(2018, 2, 28), DEFAULT_RULES).next_review_date == date(2018, 3, 1)
    assert evaluate(dob, date(2018, 3, 1), DEFAULT_RULES).category == "YOUNG_ADULT"


def test_last_category_gets_the_sentinel() -> None:
    """The last category never changes again: next_review_date is 9999-12-31."""
    result = evaluate(date(1950, 1, 1), RUN_DATE, DEFAULT_RULES)
    assert (result.category, result.next_review_date, result.category_since) == ("SENIOR", SENTINEL, date(2015, 1, 1))


def test_review_date_beyond_the_calendar_is_the_sentinel() -> None:
    """A next threshold after year 9999 is reported as the sentinel instead of overflowing."""
    assert date_reaching_age(date(9990, 5, 5), 18) == SENTINEL
    assert evaluate(date(9990, 5, 5), date(9995, 1, 1), DEFAULT_RULES).next_review_date == SENTINEL


def test_dob_equal_to_run_date_is_age_zero() -> None:
    """Born on the run date: age 0, the first category since that day, reviewed on the 18th birthday."""
    result = evaluate(RUN_DATE, RUN_DATE, DEFAULT_RULES)
    assert (result.category, result.next_review_date, result.category_since) == ("MINOR", date(2043, 6, 1), RUN_DATE)


@pytest.mark.parametrize("text", ["2001-13-01", "2001-02-30", "01-02-2001", "2001/02/01", "", "abcdefghij"])
def test_malformed_text_is_rejected(text: str) -> None:
    """Anything but a real YYYY-MM-DD date is a ValueError."""
    with pytest.raises(ValueError):
        parse_dob(text)


def test_rules_validation_and_fingerprint() -> None:
    """Rules must start at 0 and increase; the fingerprint changes with the thresholds."""
    with pytest.raises(ConfigError, match="thresholds"):
        Rules.parse("MINOR=1,ADULT=18")
    with pytest.raises(ConfigError, match="thresholds"):
        Rules.parse("MINOR=0,ADULT=18,SENIOR=18")
    assert Rules.parse("MINOR=0,YOUNG_ADULT=18,ADULT=26,SENIOR=65").fingerprint == DEFAULT_RULES.fingerprint
    assert Rules.parse("MINOR=0,YOUNG_ADULT=18,ADULT=26,SENIOR=67").fingerprint != DEFAULT_RULES.fingerprint


# The sweep's compute: decrypt once, classify failures, skip unchanged rows -------------------------------


def _sweep(cipher: DobCipher, mode: str = "full") -> CustomerStatusSweep:
    return CustomerStatusSweep(mode, cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)


def _row(cipher: DobCipher, text: str | None, category: str | None = None, next_review: date | None = None,
         failure: str | None = None) -> tuple:
    cid = uuid.uuid4()
    blob = None if text is None else cipher.encrypt_text(cid, text)
    return (cid, blob, category, next_review, failure, None if blob is None else len(blob))


def test_compute_dob_after_run_date_is_invalid_value(cipher: DobCipher) -> None:
    """A date of birth after the run date cannot be evaluated: invalid_value; only the failure kind is recorded."""
    outcome = _sweep(cipher).compute(_row(cipher, "2025-06-02"))
    assert (outcome.failure, outcome.decrypted, outcome.known) == ("invalid_value", 1, False)
    assert outcome.change[3:] == (None, None, None, None, None, "invalid_value", None)


def test_compute_malformed_plaintext_is_invalid_value(cipher: DobCipher) -> None:
    """A ciphertext that decrypts to something other than a date is invalid_value."""
    assert _sweep(cipher).compute(_row(cipher, "2001-02-30")).failure == "invalid_value"
    assert _sweep(cipher).compute(_row(cipher, "not a date")).failure == "invalid_value"


def test_compute_missing_ciphertext_is_missing_data_without_decrypt(cipher: DobCipher) -> None:
    """No ciphertext: missing_data, and no decrypt was attempted."""
    outcome = _sweep(cipher).compute(_row(cipher, None))
    assert (outcome.failure, outcome.decrypted) == ("missing_data", 0)


def test_compute_ciphertext_of_another_row_is_decrypt_failure(cipher: DobCipher) -> None:
    """A ciphertext copied from another row fails authentication: decrypt_failure, category and date kept."""
    good = _row(cipher, "1990-01-01")
    moved = (uuid.uuid4(), good[1], "ADULT", date(2020, 1, 1), None, len(good[1]))
    outcome = _sweep(cipher).compute(moved)
    assert (outcome.failure, outcome.known) == ("decrypt_failure", False)
    assert outcome.change[3:] == ("ADULT", date(2020, 1, 1), None, "ADULT", date(2020, 1, 1), "decrypt_failure", None)


def test_compute_same_failure_again_is_known_and_writes_nothing(cipher: DobCipher) -> None:
    """A due row that fails the way it failed last time is a known bad row: no write, not systemic."""
    good = _row(cipher, "1990-01-01")
    moved = (uuid.uuid4(), good[1], None, None, "decrypt_failure", len(good[1]))
    outcome = _sweep(cipher).compute(moved)
    assert (outcome.failure, outcome.known, outcome.change) == ("decrypt_failure", True, None)
    other = _sweep(cipher).compute((moved[0], moved[1], None, None, "missing_data", len(good[1])))
    assert other.known is False and other.change[8] == "decrypt_failure"


def test_compute_success_after_a_failure_clears_the_marker(cipher: DobCipher) -> None:
    """A row that evaluates again after a failure is written, clearing review_failure, even if nothing else moved."""
    result = evaluate(date(1990, 7, 1), RUN_DATE, DEFAULT_RULES)
    row = _row(cipher, "1990-07-01", result.category, result.next_review_date, "decrypt_failure")
    outcome = _sweep(cipher).compute(row)
    assert outcome.failure is None and outcome.change[8] is None


def test_compute_failed_row_with_future_date_is_made_due(cipher: DobCipher) -> None:
    """A data failure on a row stamped with a future date clears the date (keeps the category) so it stays due."""
    outcome = _sweep(cipher).compute(_row(cipher, "garbage!!!", "ADULT", date(2030, 1, 1)))
    assert outcome.failure == "invalid_value"
    assert outcome.change[6:8] == ("ADULT", None)


def test_compute_unchanged_row_has_no_change(cipher: DobCipher) -> None:
    """A row whose stored category and date equal the evaluation produces nothing to write."""
    result = evaluate(date(1990, 7, 1), RUN_DATE, DEFAULT_RULES)
    outcome = _sweep(cipher).compute(_row(cipher, "1990-07-01", result.category, result.next_review_date))
    assert (outcome.change, outcome.failure, outcome.decrypted) == (None, None, 1)


def test_compute_transition_carries_the_effective_date(cipher: DobCipher) -> None:
    """A stored category that differs yields a change whose trigger date is the day the new category began."""
    outcome = _sweep(cipher).compute(_row(cipher, "1999-06-01", "YOUNG_ADULT", RUN_DATE))
    _, _, _, old, _, _, new, next_review, failure, since = outcome.change
    assert failure is None
    assert (old, new, next_review, since) == ("YOUNG_ADULT", "ADULT", date(2064, 6, 1), date(2025, 6, 1))


def test_compute_first_computation_has_no_trigger(cipher: DobCipher) -> None:
    """A stored NULL category is a first computation: a change without a trigger date."""
    outcome = _sweep(cipher).compute(_row(cipher, "2010-01-01"))
    assert outcome.change[6] == "MINOR" and outcome.change[9] is None
