"""`batch-assets seed customers`: realistic, deterministic test data, loaded with COPY.

Every row is ACTIVE with an encrypted date of birth (docs/reference/formats.md). Without
`--due-fraction` rows are fresh (no category, `next_review_date` NULL: the
first computation). With `--due-fraction F` rows look like a settled table:
each carries the category and next review date of the run date, and F of them
are due on the run date with a real category transition. `--bad-fraction`
rows carry each failure kind of the age-category rule (docs/reference/rules.md) in turn.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import sqlalchemy as sa

from batch_assets import ConfigError, driver_connection
from batch_assets.reference.customer_status.crypto import NONCE_BYTES, DobCipher
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, Rules, evaluate

BAD_KINDS = ("missing_data", "invalid_value", "decrypt_failure")
COPY_CUSTOMERS = (
    "COPY customers (id, status, encrypted_dob, age_category, next_review_date) FROM STDIN"
)


@dataclass
class SeedReport:
    table: str
    rows: int
    due: int = 0
    bad_by_kind: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_summary(self) -> dict[str, object]:
        return {
            "status": "SUCCESS",
            "table": self.table,
            "rows": self.rows,
            "due": self.due,
            "bad_by_kind": self.bad_by_kind,
            "duration_s": round(self.duration_s, 3),
        }


def check_fraction(value: float | None, name: str) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ConfigError(f"must be between 0 and 1, got {value}", field=name)


def _uuid_from(rng: random.Random) -> uuid.UUID:
    return uuid.UUID(bytes=rng.randbytes(16), version=4)


def first_seeded_id(seed: int) -> uuid.UUID:
    """The id of the first row `seed_customers` makes under `seed`: its first draw, whatever the other options."""
    return _uuid_from(random.Random(seed))


def check_seed_unused(engine: sa.Engine, seed: int | None) -> None:
    """Refuse (exit 2, before anything is written) a seed whose rows are already in the table.

    A seed makes the same ids every time, so a second `seed customers --seed S` would collide with the
    rows of the first on the primary key; a different seed, or none, adds new distinct rows."""
    if seed is None:
        return
    with engine.connect() as conn:
        taken = conn.execute(sa.text("SELECT 1 FROM customers WHERE id = :id"), {"id": first_seeded_id(seed)}).first()
    if taken is not None:
        raise ConfigError(f"customers already holds the rows of seed {seed} (a seed makes the same ids every time); "
                          "use another --seed, or none, to add rows", field="seed")


def _dob_reaching_today(run_date: date, age: int) -> date:
    try:
        return run_date.replace(year=run_date.year - age)
    except ValueError:  # run date is 29 Feb and that year is common
        return date(run_date.year - age, 3, 1)


def seed_customers(
    engine: sa.Engine,
    cipher: DobCipher,
    rows: int,
    *,
    run_date: date,
    due_fraction: float | None = None,
    bad_fraction: float = 0.0,
    seed: int | None = None,
    rules: Rules = DEFAULT_RULES,
    progress: Callable[[int], None] | None = None,
) -> SeedReport:
    """Insert `rows` ACTIVE customers with COPY in one transaction; deterministic when `seed` is given.

    A seed already used on this table is refused before anything is written (`check_seed_unused`); a
    duplicate id the check cannot see (another writer inserting the same ids meanwhile) rolls the whole
    COPY back and is a ConfigError naming `seed` too. `progress` counts rows sent, not yet committed."""
    import time

    import psycopg

    if rows <= 0:
        raise ConfigError(f"must be positive, got {rows}", field="rows")
    check_fraction(due_fraction, "due_fraction")
    check_fraction(bad_fraction, "bad_fraction")
    check_seed_unused(engine, seed)
    started = time.perf_counter()
    rng = random.Random(seed) if seed is not None else random.Random()
    report = SeedReport("customers", rows, bad_by_kind={k: 0 for k in BAD_KINDS})
    raw = engine.raw_connection()
    try:
        pg = driver_connection(raw)
        try:
            _copy_rows(pg, cipher, rows, rng, report, run_date=run_date, due_fraction=due_fraction,
                       bad_fraction=bad_fraction, rules=rules, progress=progress)
            raw.commit()
        except psycopg.errors.UniqueViolation:
            raw.rollback()
            raise ConfigError("a seeded id is already in customers (nothing was written); use another --seed",
                              field="seed") from None
        # Fresh statistics, so the planner keeps the keyset plans (primary key / customers_due_idx)
        # right after a bulk load instead of guessing from an empty table.
        with pg.cursor() as cur:
            cur.execute("ANALYZE customers")
        raw.commit()
    finally:
        raw.close()
    if due_fraction is None:
        report.due = rows
    report.duration_s = time.perf_counter() - started
    return report


def _copy_rows(
    pg: Any,
    cipher: DobCipher,
    rows: int,
    rng: random.Random,
    report: SeedReport,
    *,
    run_date: date,
    due_fraction: float | None,
    bad_fraction: float,
    rules: Rules,
    progress: Callable[[int], None] | None,
) -> None:
    """COPY the rows (not committed: the caller commits)."""
    max_days = 100 * 366
    thresholds = [r.min_age for r in rules.rules[1:]]
    categories = [r.category for r in rules.rules]
    with pg.cursor() as cur, cur.copy(COPY_CUSTOMERS) as copy:
        for n in range(rows):
            cid = _uuid_from(rng)
            nonce = rng.randbytes(NONCE_BYTES)
            category: str | None = None
            next_review: date | None = None
            if bad_fraction and rng.random() < bad_fraction:
                kind = BAD_KINDS[report_bad_total(report) % len(BAD_KINDS)]
                report.bad_by_kind[kind] += 1
                if kind == "missing_data":
                    blob = None
                elif kind == "invalid_value":
                    text = "not-a-date" if n % 2 else (run_date + timedelta(days=30)).isoformat()
                    blob = cipher.encrypt_text(cid, text, nonce)
                else:  # a ciphertext bound to another row: authentication fails
                    blob = cipher.encrypt_text(_uuid_from(rng), "1990-01-01", nonce)
                copy.write_row((cid, "ACTIVE", blob, None, None))
                continue
            if due_fraction is not None and rng.random() < due_fraction and thresholds:
                i = rng.randrange(len(thresholds))
                dob = _dob_reaching_today(run_date, thresholds[i])
                category, next_review = categories[i], run_date
                report.due += 1
            else:
                dob = run_date - timedelta(days=rng.randrange(max_days))
                if due_fraction is not None:
                    result = evaluate(dob, run_date, rules)
                    category, next_review = result.category, result.next_review_date
            blob = cipher.encrypt_text(cid, dob.isoformat(), nonce)
            copy.write_row((cid, "ACTIVE", blob, category, next_review))
            if progress is not None and n % 50_000 == 49_999:
                progress(n + 1)


def report_bad_total(report: SeedReport) -> int:
    return sum(report.bad_by_kind.values())
