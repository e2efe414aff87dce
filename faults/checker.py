"""Invariants from independent checks: nothing here imports the product's engine or runner.

Dates of birth are decrypted with `cryptography` directly as docs/reference/formats.md describes
(12-byte nonce ‖ AES-256-GCM, the customer's 16 id bytes as associated data), and
the age-category rule (docs/reference/rules.md) is computed by this module's own code, so a
bug in the product's rule cannot hide itself.

What is checked, against a `Baseline` taken before the fault:
- customers: every ACTIVE row equals the rule for the run date; a row that cannot be
  evaluated keeps its category and stays due;
- one review trigger and one outbox event per transition (baseline → now), none for
  a row that did not change;
- payments: every one DONE, and DONE once (the campaign's audit trigger logs every
  write of DONE), at most 2 accepted POSTs per Idempotency-Key at the stub;
- subscriptions all-or-nothing: EXPIRED ⇒ no enrollments, ACTIVE/FAILED ⇒ the
  enrollments it had;
- beside other writers (docs/reference/tables.md): no row *stale* (not due, holding the result of a date of
  birth it no longer has); with the campaign's write log, every write of the product is the rule
  applied to the ciphertext the row held as it was written, and the triggers and events are those
  of the logged writes;
- hostile rows: each kind's named outcome (`hostile_customer_outcomes`, `hostile_payment_outcomes`,
  `expected_failures` for the counts a run must report);
- hostile declarations (faults/declarations.py): the team's tables hold only what the team's rule (`team_tier`,
  written here) gives, and only where a run may write; a refused command changed nothing (`database_state`);
  no canary (a row's value, the encryption key) is in any text the product keeps (`bookkeeping_texts`).
"""

from __future__ import annotations

import base64
import calendar
import os
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import sqlalchemy as sa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SENTINEL = date(9999, 12, 31)
DEFAULT_RULES: tuple[tuple[str, int], ...] = (("MINOR", 0), ("YOUNG_ADULT", 18), ("ADULT", 26), ("SENIOR", 65))
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DATE_BYTES = re.compile(rb"[0-9]{4}-[0-9]{2}-[0-9]{2}")
MAX_ACCEPTED_POSTS = 2
DETAILS = 5  # examples kept per kind of violation
NONCE_BYTES, TAG_BYTES = 12, 16

# The campaign's audit of payment completions: every UPDATE that writes status DONE
# leaves one row, so "DONE twice" is visible even when the second write changed nothing.
DONE_AUDIT_SQL = (
    "CREATE TABLE IF NOT EXISTS faults_done_log (payment_id uuid NOT NULL, at timestamptz NOT NULL DEFAULT now())",
    # SECURITY DEFINER: the product's role writes payments, the log belongs to the campaign.
    """CREATE OR REPLACE FUNCTION faults_log_done() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public AS $$
BEGIN
    IF NEW.status = 'DONE' THEN
        INSERT INTO faults_done_log (payment_id) VALUES (NEW.id);
    END IF;
    RETURN NEW;
END;
$$""",
    "DROP TRIGGER IF EXISTS faults_done_audit ON payments",
    "CREATE TRIGGER faults_done_audit AFTER UPDATE OF status ON payments "
    "FOR EACH ROW EXECUTE FUNCTION faults_log_done()",
)


def install_done_audit(conn: sa.Connection) -> None:
    for statement in DONE_AUDIT_SQL:
        conn.exec_driver_sql(statement)


# --- the ciphertext and the rule, written here -----------------------------------------------


def decode_key(text: str) -> bytes:
    padded = text.strip() + "=" * (-len(text.strip()) % 4)
    return base64.urlsafe_b64decode(padded.encode("ascii"))


def decrypt_bytes(aead: AESGCM, customer_id: uuid.UUID, blob: bytes | None) -> bytes | None:
    """The plaintext bytes, or None when they do not decrypt (wrong key, row or bytes)."""
    if blob is None or len(blob) < NONCE_BYTES + TAG_BYTES:
        return None
    try:
        return aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], customer_id.bytes)
    except InvalidTag:
        return None


def decrypt_dob(aead: AESGCM, customer_id: uuid.UUID, blob: bytes | None) -> str | None:
    """The ASCII plaintext, or None when it does not decrypt or is not ASCII."""
    plain = decrypt_bytes(aead, customer_id, blob)
    try:
        return None if plain is None else plain.decode("ascii")
    except UnicodeDecodeError:
        return None


def encrypt_bytes(aead: AESGCM, customer_id: uuid.UUID, plain: bytes) -> bytes:
    """The encrypted date of birth (docs/reference/formats.md) over any bytes (the product's own encoder takes ASCII
    text only)."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + aead.encrypt(nonce, plain, customer_id.bytes)


def _reaches(dob: date, year: int) -> date:
    """The day in `year` on which a new age is completed (29 Feb → 1 Mar in common years)."""
    if year > SENTINEL.year:
        return SENTINEL
    if dob.month == 2 and dob.day == 29 and not calendar.isleap(year):
        return date(year, 3, 1)
    return dob.replace(year=year)


def age_on(dob: date, day: date) -> int:
    years = day.year - dob.year
    return years - 1 if day < _reaches(dob, day.year) else years


@dataclass(frozen=True)
class Expected:
    category: str
    next_review_date: date
    since: date


def rule(dob: date, run_date: date, rules: Sequence[tuple[str, int]]) -> Expected:
    age = age_on(dob, run_date)
    index = max(i for i, (_, min_age) in enumerate(rules) if min_age <= age)
    category, min_age = rules[index]
    since = _reaches(dob, dob.year + min_age)
    nxt = _reaches(dob, dob.year + rules[index + 1][1]) if index + 1 < len(rules) else SENTINEL
    return Expected(category, nxt, since)


def evaluate_row(aead: AESGCM, cid: uuid.UUID, blob: bytes | None, run_date: date,
                 rules: Sequence[tuple[str, int]]) -> Expected | str:
    """The expected result, or the failure kind of a row that cannot be evaluated (docs/reference/rules.md)."""
    if blob is None or len(blob) == 0:
        return "missing_data"
    plain = decrypt_bytes(aead, cid, bytes(blob))
    if plain is None:
        return "decrypt_failure"
    # Exactly YYYY-MM-DD in ASCII digits: the bytes are matched, so no other digits or whitespace pass.
    if not _DATE_BYTES.fullmatch(plain):
        return "invalid_value"
    try:
        dob = date.fromisoformat(plain.decode("ascii"))
    except ValueError:
        return "invalid_value"
    if dob > run_date:
        return "invalid_value"
    return rule(dob, run_date, rules)


# --- baseline and reports ----------------------------------------------------------


@dataclass
class Baseline:
    """What the tables held before the fault (`blobs` only when taken `with_blobs`)."""

    categories: dict[uuid.UUID, str | None] = field(default_factory=dict)
    trigger_max_id: int = 0
    outbox_max_id: int = 0
    enrollments: dict[int, int] = field(default_factory=dict)
    subscription_status: dict[int, str] = field(default_factory=dict)
    blobs: dict[uuid.UUID, bytes | None] = field(default_factory=dict)


def take_baseline(conn: sa.Connection, *, with_blobs: bool = False) -> Baseline:
    b = Baseline()
    for cid, cat, blob in conn.exec_driver_sql(
        "SELECT id, age_category, CASE WHEN %(blobs)s THEN encrypted_dob END FROM customers WHERE status = 'ACTIVE'",
        {"blobs": with_blobs},
    ):
        b.categories[cid] = cat
        if with_blobs:
            b.blobs[cid] = None if blob is None else bytes(blob)
    b.trigger_max_id = int(conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM review_triggers").scalar() or 0)
    b.outbox_max_id = int(conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM outbox_events").scalar() or 0)
    for sid, status, n in conn.exec_driver_sql(
        "SELECT s.id, s.status, count(e.id) FROM subscriptions s LEFT JOIN enrollments e ON e.subscription_id = s.id "
        "GROUP BY s.id, s.status"
    ):
        b.enrollments[sid] = int(n)
        b.subscription_status[sid] = status
    return b


@dataclass
class Edits:
    """What other services wrote into `encrypted_dob` while jobs ran: per row, the ciphertexts in order.

    A row listed here may legitimately be left due (`pending`: its edit came after the run read it) and
    may hold the result of any of its dates of birth only while it is due; a row that is not due and holds
    the result of a date of birth it no longer has is *stale* (docs/reference/tables.md).
    """

    blobs: dict[uuid.UUID, list[bytes | None]] = field(default_factory=dict)

    def add(self, cid: uuid.UUID, blob: bytes | None) -> None:
        self.blobs.setdefault(cid, []).append(blob)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.blobs.values())


# The campaign's audit of the product's writes to customers: every UPDATE that changes
# age_category or next_review_date without touching encrypted_dob (the product's write; a
# writer's edit changes encrypted_dob) leaves one row with the ciphertext the row held at
# that moment, so "a result computed from a value the row no longer held" is visible per write.
WRITE_LOG_SQL = (
    "CREATE TABLE IF NOT EXISTS faults_write_log (seq bigserial PRIMARY KEY, customer_id uuid NOT NULL, "
    "dob bytea NULL, old_category text NULL, new_category text NULL, old_date date NULL, new_date date NULL)",
    # SECURITY DEFINER: the product's role writes customers, the log belongs to the campaign.
    """CREATE OR REPLACE FUNCTION faults_log_write() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public AS $$
BEGIN
    INSERT INTO faults_write_log (customer_id, dob, old_category, new_category, old_date, new_date)
    VALUES (NEW.id, NEW.encrypted_dob, OLD.age_category, NEW.age_category, OLD.next_review_date,
            NEW.next_review_date);
    RETURN NEW;
END;
$$""",
    "DROP TRIGGER IF EXISTS faults_write_audit ON customers",
    "CREATE TRIGGER faults_write_audit AFTER UPDATE OF age_category, next_review_date ON customers "
    "FOR EACH ROW WHEN (OLD.encrypted_dob IS NOT DISTINCT FROM NEW.encrypted_dob "
    "AND (OLD.age_category IS DISTINCT FROM NEW.age_category "
    "OR OLD.next_review_date IS DISTINCT FROM NEW.next_review_date)) EXECUTE FUNCTION faults_log_write()",
)


def install_write_log(conn: sa.Connection) -> None:
    for statement in WRITE_LOG_SQL:
        conn.exec_driver_sql(statement)


@dataclass(frozen=True)
class Write:
    """One logged write of the product: the ciphertext the row held, the result before and after."""

    dob: bytes | None
    old_category: str | None
    new_category: str | None
    old_date: date | None
    new_date: date | None


def load_writes(conn: sa.Connection) -> dict[uuid.UUID, list[Write]] | None:
    """The write log in commit order per row; None when the log is not installed."""
    if not conn.exec_driver_sql("SELECT to_regclass('faults_write_log') IS NOT NULL").scalar():
        return None
    writes: dict[uuid.UUID, list[Write]] = {}
    for cid, dob, oc, nc, od, nd in conn.exec_driver_sql(
        "SELECT customer_id, dob, old_category, new_category, old_date, new_date FROM faults_write_log ORDER BY seq"
    ):
        writes.setdefault(cid, []).append(Write(None if dob is None else bytes(dob), oc, nc, od, nd))
    return writes


@dataclass
class Report:
    """Violations by kind (a count and a few examples each) plus counters that are not violations."""

    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    info: Counter[str] = field(default_factory=Counter)
    stale_rows: set[uuid.UUID] = field(default_factory=set)

    def add(self, kind: str, example: str, n: int = 1) -> None:
        self.violations[kind] += n
        kept = self.examples.setdefault(kind, [])
        if len(kept) < DETAILS:
            kept.append(example)

    def merge(self, other: Report) -> None:
        for kind, n in other.violations.items():
            self.violations[kind] += n
            self.examples.setdefault(kind, []).extend(other.examples.get(kind, [])[: DETAILS])
        self.info.update(other.info)
        self.stale_rows |= other.stale_rows

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def rows_lost(self) -> int:
        return sum(n for k, n in self.violations.items() if k in LOST_KINDS)

    @property
    def duplicates(self) -> int:
        return sum(n for k, n in self.violations.items() if k in DUPLICATE_KINDS)

    @property
    def stale(self) -> int:
        """Rows that held, not due, a result of a date of birth they no longer had (or were written so)."""
        return len(self.stale_rows)

    def describe(self) -> str:
        parts = []
        for kind, n in sorted(self.violations.items()):
            parts.append(f"{kind}={n} (e.g. {'; '.join(self.examples.get(kind, [])[:2])})")
        return ", ".join(parts) or "ok"


LOST_KINDS = {"wrong_category", "wrong_next_review", "uncomputed", "failed_row_not_due", "failed_row_category_changed",
              "missing_trigger", "missing_event", "payment_not_done", "subscription_not_expired",
              "subscription_partial", "event_not_sent", "wrong_write", "failed_row_written",
              "team_row_written", "team_row_wrong", "team_row_uncomputed", "written_while_refused"}
DUPLICATE_KINDS = {"duplicate_trigger", "duplicate_event", "trigger_without_transition", "event_without_transition",
                   "payment_done_twice", "payment_posts_over_limit"}
STALE_KINDS = {"stale", "stale_write"}  # counted per row in Report.stale, apart from rows lost

Transition = tuple[str | None, str | None, date | None]  # (from, to, effective date or None: any)


@dataclass
class _Context:
    aead: AESGCM
    run_date: date
    rules: Sequence[tuple[str, int]]
    baseline: Baseline
    edits: Edits | None
    pending: bool
    writes: dict[uuid.UUID, list[Write]] | None
    report: Report = field(default_factory=Report)
    transitions: dict[uuid.UUID, list[Transition]] = field(default_factory=dict)

    def held(self, cid: uuid.UUID) -> list[bytes | None]:
        """Every ciphertext the row held since the baseline (its current one included)."""
        blobs = [self.baseline.blobs[cid]] if cid in self.baseline.blobs else []
        return blobs + (self.edits.blobs.get(cid, []) if self.edits is not None else [])

    def result_of_another_dob(self, cid: uuid.UUID, current: bytes | None, cat: str | None,
                              nrd: date | None) -> bool:
        for blob in self.held(cid):
            if blob == current:
                continue
            got = evaluate_row(self.aead, cid, blob, self.run_date, self.rules)
            if isinstance(got, Expected) and (got.category, got.next_review_date) == (cat, nrd):
                return True
        return False


def check_customers(conn: sa.Connection, key_text: str, run_date: date, rules: Sequence[tuple[str, int]],
                    baseline: Baseline, *, edits: Edits | None = None, pending: bool = False) -> Report:
    """Every ACTIVE row against the rule; one trigger and one event per transition.

    With the campaign's write log installed (`install_write_log`), every logged write is checked against
    the ciphertext the row held when it was written, and the transitions are the logged writes; else
    they are baseline → now. `edits`: what other services wrote into `encrypted_dob` (stale detection);
    `pending`: right after the run that ran beside them, when an edited row may still be due.
    """
    ctx = _Context(AESGCM(decode_key(key_text)), run_date, rules, baseline, edits, pending, load_writes(conn))
    result = conn.execution_options(stream_results=True, max_row_buffer=5000).exec_driver_sql(
        "SELECT id, encrypted_dob, age_category, next_review_date FROM customers WHERE status = 'ACTIVE'"
    )
    for cid, blob, cat, nrd in result:
        _check_row(ctx, cid, None if blob is None else bytes(blob), cat, nrd)
    if ctx.writes is not None:
        for cid, writes in ctx.writes.items():
            _check_writes(ctx, cid, writes)
    report = ctx.report
    report.info["transitions"] = sum(len(v) for v in ctx.transitions.values())
    _check_side_effects(conn, baseline, ctx.transitions, report)
    return report


def _check_row(ctx: _Context, cid: uuid.UUID, blob: bytes | None, cat: str | None, nrd: date | None) -> None:
    report, run_date = ctx.report, ctx.run_date
    before = ctx.baseline.categories.get(cid)
    if ctx.writes is not None and ctx.writes.get(cid):
        before = ctx.writes[cid][-1].new_category  # the category of the product's last (checked) write
    edited = ctx.edits is not None and cid in ctx.edits.blobs
    expected = evaluate_row(ctx.aead, cid, blob, run_date, ctx.rules)
    if isinstance(expected, str):
        report.info["unevaluable"] += 1
        report.info[f"unevaluable_{expected}"] += 1
        if nrd is not None and nrd > run_date:
            report.add("failed_row_not_due", f"{cid} ({expected}) holds {cat} with a future next_review_date")
        if cat != before:
            report.add("failed_row_category_changed", f"{cid} ({expected}) {before} -> {cat}")
        return
    if (cat, nrd) != (expected.category, expected.next_review_date):
        if ctx.pending and edited and cid not in ctx.baseline.blobs:
            report.info["inserted_not_read"] += 1  # inserted while the run ran, maybe behind its cursor
        elif nrd is None or nrd <= run_date:
            if edited and ctx.pending:
                report.info["edited_left_due"] += 1  # edited after the run read it: the next run computes it
            else:
                # Left due: the next delta would still repair it, but a SUCCESS run that left it is untruthful.
                report.add("uncomputed", f"{cid} left due: stored {cat}, expected {expected.category}")
        elif edited and ctx.result_of_another_dob(cid, blob, cat, nrd):
            # Not due and computed from a date of birth the row no longer holds: no delta will repair it.
            report.add("stale", f"{cid} holds {cat} / not due, from a date of birth it no longer has; "
                                f"its current one gives {expected.category}")
            report.stale_rows.add(cid)
        elif cat != expected.category:
            # Not due: no delta will ever look at it again.
            report.add("wrong_category", f"{cid} stored {cat} expected {expected.category} (not due)")
        else:
            report.add("wrong_next_review", f"{cid} ({cat}) next_review_date is not the rule's")
    if ctx.writes is None and cat != before:
        # A written transition (counted once as a row problem above when it is the wrong one).
        since = expected.since if cat == expected.category else None
        ctx.transitions[cid] = [(before, cat, since)]


def _check_writes(ctx: _Context, cid: uuid.UUID, writes: list[Write]) -> None:
    """Each logged write must be the rule applied to the ciphertext the row held as it was written."""
    report, run_date = ctx.report, ctx.run_date
    for w in writes:
        expected = evaluate_row(ctx.aead, cid, w.dob, run_date, ctx.rules)
        since: date | None = None
        if isinstance(expected, str):
            if w.new_category != w.old_category or (w.new_date is not None and w.new_date > run_date):
                report.add("failed_row_written", f"{cid} ({expected}) written {w.new_category}, not left due")
        elif (w.new_category, w.new_date) == (expected.category, expected.next_review_date):
            since = expected.since
        elif ctx.result_of_another_dob(cid, w.dob, w.new_category, w.new_date):
            report.add("stale_write", f"{cid} written {w.new_category} from a date of birth it no longer held "
                                      f"(its ciphertext then gives {expected.category})")
            report.stale_rows.add(cid)
        else:
            report.add("wrong_write", f"{cid} written {w.new_category}, expected {expected.category}")
        if w.new_category != w.old_category:
            ctx.transitions.setdefault(cid, []).append((w.old_category, w.new_category, since))


def _match(expected: list[Transition], got: list[Transition], *, dated: bool) -> tuple[list[Transition], list[
        Transition], list[tuple[Transition, Transition]]]:
    """(expected left unmatched, got left unmatched, pairs whose from/to match but date differs)."""
    left = list(got)
    missing: list[Transition] = []
    for e in expected:
        hit = next((g for g in left if g[:2] == e[:2] and (not dated or e[2] is None or g[2] == e[2])), None)
        if hit is None:
            missing.append(e)
        else:
            left.remove(hit)
    wrong: list[tuple[Transition, Transition]] = []
    for e in list(missing):
        hit = next((g for g in left if g[:2] == e[:2]), None)
        if hit is not None:
            wrong.append((e, hit))
            missing.remove(e)
            left.remove(hit)
    return missing, left, wrong


def _check_side_effects(conn: sa.Connection, baseline: Baseline,
                        transitions: Mapping[uuid.UUID, list[Transition]], report: Report) -> None:
    triggers: dict[uuid.UUID, list[Transition]] = {}
    for cid, frm, to, eff in conn.exec_driver_sql(
        "SELECT customer_id, from_category, to_category, effective_date FROM review_triggers WHERE id > %(after)s",
        {"after": baseline.trigger_max_id},
    ):
        triggers.setdefault(cid, []).append((frm, to, eff))
    events: dict[uuid.UUID, list[Transition]] = {}
    for cid, payload in conn.exec_driver_sql(
        "SELECT aggregate_id, payload FROM outbox_events WHERE id > %(after)s AND event_type = 'age_category_changed'",
        {"after": baseline.outbox_max_id},
    ):
        payload = payload if isinstance(payload, dict) else {}
        events.setdefault(cid, []).append((payload.get("from_category"), payload.get("to_category"), None))
    report.info["new_triggers"] = sum(len(v) for v in triggers.values())
    report.info["new_events"] = sum(len(v) for v in events.values())
    for cid, ts in transitions.items():
        _compare(cid, ts, events.pop(cid, []), "event", dated=False, report=report)
        # A first computation (from NULL) writes no trigger; the natural key keeps one per (to, date).
        wanted: list[Transition] = []
        for t in ts:
            if t[0] is not None and not any(w[1:] == t[1:] and t[2] is not None for w in wanted):
                wanted.append(t)
        _compare(cid, wanted, triggers.pop(cid, []), "trigger", dated=True, report=report)
    for cid, got in events.items():
        report.add("event_without_transition", f"{cid} got {len(got)} event(s) without a transition", len(got))
    for cid, got_t in triggers.items():
        report.add("trigger_without_transition", f"{cid} got {len(got_t)} trigger(s) without a transition", len(got_t))


def _compare(cid: uuid.UUID, wanted: list[Transition], got: list[Transition], what: str, *, dated: bool,
             report: Report) -> None:
    missing, extra, wrong = _match(wanted, got, dated=dated)
    for e in missing:
        report.add(f"missing_{what}", f"{cid} {e[0]} -> {e[1]} has no {what}")
    for e, g in wrong:
        report.add(f"wrong_{what}", f"{cid} {what} {g} expected {e}")
    pairs = {t[:2] for t in wanted}
    for g in extra:
        if g[:2] in pairs:
            report.add(f"duplicate_{what}", f"{cid} {g[0]} -> {g[1]} has more than one {what}")
        elif wanted:
            report.add(f"wrong_{what}", f"{cid} {what} {g[:2]} for {[t[:2] for t in wanted]}")
        else:
            report.add(f"{what}_without_transition", f"{cid} got a {what} {g[:2]} without a transition")


def check_subscriptions(conn: sa.Connection, run_date: date, baseline: Baseline, *, complete: bool) -> Report:
    """All-or-nothing per subscription; with `complete`, no ACTIVE subscription past its expiry is left."""
    report = Report()
    for sid, status, expiry, n in conn.exec_driver_sql(
        "SELECT s.id, s.status, s.expiry_date, count(e.id) FROM subscriptions s "
        "LEFT JOIN enrollments e ON e.subscription_id = s.id GROUP BY s.id, s.status, s.expiry_date"
    ):
        had = baseline.enrollments.get(sid, 0)
        report.info[f"subscriptions_{status.lower()}"] += 1
        if status == "EXPIRED" and n:
            report.add("subscription_partial", f"subscription {sid} EXPIRED with {n} enrollments")
        elif status in ("ACTIVE", "FAILED") and n != had:
            report.add("subscription_partial", f"subscription {sid} {status} has {n} of {had} enrollments")
        if complete and status == "ACTIVE" and expiry is not None and expiry < run_date:
            report.add("subscription_not_expired", f"subscription {sid} ACTIVE, expiry {expiry} < {run_date}")
    return report


def check_payments(conn: sa.Connection, posts: Mapping[str, int], accepted: Mapping[str, int], *,
                   complete: bool, refused: frozenset[uuid.UUID] = frozenset()) -> Report:
    """DONE once per payment (audit log), at most 2 accepted POSTs per payment; with `complete`, all DONE.

    `refused`: hostile payments the product FAILED with a true reason (a permanent outcome, not a loss).
    """
    report = Report()
    done_writes = Counter(
        str(pid) for (pid,) in conn.exec_driver_sql("SELECT payment_id FROM faults_done_log")
    )
    for pid, status, attempts in conn.exec_driver_sql("SELECT id, status, attempts FROM payments"):
        key = str(pid)
        report.info[f"payments_{status.lower()}"] += 1
        if done_writes[key] > 1:
            report.add("payment_done_twice", f"payment {key} written DONE {done_writes[key]} times",
                       done_writes[key] - 1)
        if accepted.get(key, 0) > MAX_ACCEPTED_POSTS:
            report.add("payment_posts_over_limit", f"payment {key} accepted {accepted[key]} POSTs")
        if complete and status != "DONE" and not (status == "FAILED" and pid in refused):
            report.add("payment_not_done", f"payment {key} is {status} after {attempts} attempts")
    report.info["posts_total"] = sum(posts.values())
    report.info["posts_max_per_key"] = max(posts.values(), default=0)
    return report


def check_outbox_sent(conn: sa.Connection, sink_ids: Counter[int], lost_by_sink: set[int] | None = None) -> Report:
    """Every event SENT and present in the sink (at least once; resends are counted, not violations).

    `lost_by_sink`: events the sink itself lost (it was restarted empty); they need only be SENT.
    """
    report = Report()
    for eid, status in conn.exec_driver_sql("SELECT id, status FROM outbox_events"):
        if status != "SENT":
            report.add("event_not_sent", f"event {eid} is {status}")
        elif sink_ids[int(eid)] == 0 and int(eid) not in (lost_by_sink or ()):
            report.add("event_not_sent", f"event {eid} SENT but not in the sink")
    report.info["sink_resends"] = sum(n - 1 for n in sink_ids.values() if n > 1)
    return report


# --- hostile rows -------------------------------------------------------------------------


@dataclass(frozen=True)
class HostileRow:
    """A row another service wrote with a hostile value: its kind, the outcome the rule or the queue gives it
    (a failure kind, `computed` or `DONE`), the row, how it was written and the category it held."""

    kind: str
    expected: str
    cid: uuid.UUID
    variant: str
    category: str | None


@dataclass
class HostileOutcome:
    """What the rows of one hostile kind became: distinct observations (with the variants that showed each)."""

    kind: str
    expected: str
    seen: dict[str, list[str]] = field(default_factory=dict)
    ok: bool = True

    def see(self, text: str, ok: bool, variant: str | None = None) -> None:
        variants = self.seen.setdefault(text, [])
        if variant and variant not in variants:
            variants.append(variant)
        self.ok = self.ok and ok

    @property
    def observed(self) -> list[str]:
        return [f"{text} ({', '.join(v)})" if v else text for text, v in self.seen.items()]


def hostile_customer_state(aead: AESGCM, row: HostileRow, blob: bytes | None, cat: str | None, nrd: date | None,
                           run_date: date, rules: Sequence[tuple[str, int]]) -> tuple[str, bool]:
    """What the row is now (no date of birth or date derived from one in the text) and whether that is right.

    A failed row keeps the category it held and is due (NULL or <= the run date); a valid one is computed.
    """
    got = evaluate_row(aead, row.cid, blob, run_date, rules)
    if row.expected != "computed":
        if got != row.expected:  # the campaign itself built the row wrong: say so, never pass it
            return f"campaign error: the checker sees {got if isinstance(got, str) else 'a valid date'}", False
        due = nrd is None or nrd <= run_date
        kept = cat == row.category
        text = ("due" if due else "NOT due") + (", category kept" if kept else f", category {row.category} -> {cat}")
        return text, due and kept
    assert isinstance(got, Expected)
    if (cat, nrd) == (got.category, got.next_review_date):
        return f"computed {cat}", True
    return f"not computed: holds {cat}{'' if nrd is None or nrd <= run_date else ', NOT due'}", False


def hostile_customer_outcomes(conn: sa.Connection, key_text: str, run_date: date, rules: Sequence[tuple[str, int]],
                              rows: Sequence[HostileRow]) -> dict[str, HostileOutcome]:
    """Per hostile kind, the state of each of its rows (see `hostile_customer_state`)."""
    aead = AESGCM(decode_key(key_text))
    out: dict[str, HostileOutcome] = {}
    state = {cid: (blob, cat, nrd) for cid, blob, cat, nrd in conn.exec_driver_sql(
        "SELECT id, encrypted_dob, age_category, next_review_date FROM customers WHERE id = ANY(%(ids)s)",
        {"ids": [r.cid for r in rows]})}
    for row in rows:
        outcome = out.setdefault(row.kind, HostileOutcome(row.kind, row.expected))
        if row.cid not in state:
            outcome.see("row gone", False, row.variant)
            continue
        blob, cat, nrd = state[row.cid]
        text, ok = hostile_customer_state(aead, row, None if blob is None else bytes(blob), cat, nrd, run_date, rules)
        outcome.see(text, ok, row.variant)
    return out


def expected_failures(conn: sa.Connection, key_text: str, run_date: date, rules: Sequence[tuple[str, int]], *,
                      due_only: bool) -> Counter[str]:
    """`failed_by_type` a sweep must report over the rows it reads (every ACTIVE row, or the due ones)."""
    aead = AESGCM(decode_key(key_text))
    counts: Counter[str] = Counter()
    result = conn.execution_options(stream_results=True, max_row_buffer=5000).exec_driver_sql(
        "SELECT id, encrypted_dob FROM customers WHERE status = 'ACTIVE' "
        "AND (NOT %(due)s OR next_review_date IS NULL OR next_review_date <= %(rd)s)",
        {"due": due_only, "rd": run_date})
    for cid, blob in result:
        got = evaluate_row(aead, cid, None if blob is None else bytes(blob), run_date, rules)
        if isinstance(got, str):
            counts[got] += 1
    return counts


def hostile_payment_state(status: str, attempts: int, last_error: str | None) -> tuple[str, bool]:
    """DONE, or FAILED with a last_error that tells the truth; a row left NEW or PROCESSING is lost.

    No hostile payment's claim lapsed under this product, so "lapsed" is not a true reason for one.
    """
    if status == "DONE":
        return "DONE", True
    if status == "FAILED":
        reason = (last_error or "").strip()
        ok = bool(reason) and "lapse" not in reason.lower()
        return f"FAILED after {attempts} attempts: {reason[:70] or 'no last_error'}", ok
    return f"left {status}: lost", False


def hostile_payment_outcomes(conn: sa.Connection, rows: Sequence[HostileRow]) -> dict[str, HostileOutcome]:
    out: dict[str, HostileOutcome] = {}
    state = {pid: (status, attempts, err) for pid, status, attempts, err in conn.exec_driver_sql(
        "SELECT id, status, attempts, last_error FROM payments WHERE id = ANY(%(ids)s)",
        {"ids": [r.cid for r in rows]})}
    for row in rows:
        outcome = out.setdefault(row.kind, HostileOutcome(row.kind, row.expected))
        if row.cid not in state:
            outcome.see("row gone", False)
            continue
        outcome.see(*hostile_payment_state(*state[row.cid]))
    return out


# --- hostile declarations -------------------------------------------------------------------------


TEAM_TIERS = ("BRONZE", "SILVER", "GOLD")
TEAM_REVIEW = timedelta(days=30)
TEAM_ROW_KINDS = ("team_row_written", "team_row_wrong", "team_row_uncomputed", "written_while_refused")
"""Rows a run wrote that it should not have, or wrote wrong, or left uncomputed; anything a refused command wrote."""


def team_tier(points: int, run_date: date) -> tuple[str, date]:
    """The campaign's team rule, written here apart from the module its declaration names: (tier, review date)."""
    return TEAM_TIERS[points % 3], run_date + TEAM_REVIEW


@dataclass(frozen=True)
class Account:
    """A row of the campaign's team table `accounts` (points and code are its canaries, never shown)."""

    status: str
    points: int
    tier: str | None
    review: date | None


def team_accounts(conn: sa.Connection) -> dict[uuid.UUID, Account]:
    return {key: Account(status, points, tier, review) for key, status, points, tier, review in conn.exec_driver_sql(
        "SELECT id, status, points, tier, tier_review_on FROM accounts")}


def check_team_accounts(before: Mapping[uuid.UUID, Account], after: Mapping[uuid.UUID, Account], run_date: date, *,
                        hostile: Callable[[int], bool] | None = None, complete: bool) -> Report:
    """The team's table after a run: a row out of its scope (not OPEN) and a hostile row are as they were; every
    other row is as it was or (all of them, when `complete`) the rule's. Examples name rows by key only."""
    report = Report()
    for key, row in after.items():
        was = before.get(key)
        kept = was is not None and (row.tier, row.review) == (was.tier, was.review)
        if row.status != "OPEN" or (hostile is not None and hostile(row.points)):
            if not kept:
                what = "a hostile row" if row.status == "OPEN" else "a row out of scope (not OPEN)"
                report.add("team_row_written", f"{what} {key} was written")
            continue
        if (row.tier, row.review) == team_tier(row.points, run_date):
            report.info["team_rows_written" if not kept else "team_rows_already_right"] += 1
        elif not kept:
            report.add("team_row_wrong", f"{key} written {row.tier!r}, not the rule's tier")
        elif complete:
            report.add("team_row_uncomputed", f"{key} left as it was")
        else:
            report.info["team_rows_left"] += 1
    return report


def team_jobs(conn: sa.Connection) -> dict[int, tuple[str, int]]:
    """The campaign's team queue `team_jobs`: id → (status, attempts)."""
    return {jid: (status, attempts) for jid, status, attempts in conn.exec_driver_sql(
        "SELECT id, status, attempts FROM team_jobs")}


def check_team_jobs(jobs: Mapping[int, tuple[str, int]], *, hostile: Callable[[int], bool] | None = None,
                    complete: bool) -> Report:
    """The team's queue after a drain: a hostile job is never DONE (its handler never returned); with `complete`
    (a drain that said SUCCESS) every other job is."""
    report = Report()
    for jid, (status, attempts) in jobs.items():
        if hostile is not None and hostile(jid):
            if status == "DONE":
                report.add("team_row_written", f"job {jid} DONE although its handler never returned")
            continue
        if status != "DONE" and not complete:
            report.info["team_jobs_left"] += 1
        elif status != "DONE":
            report.add("team_row_uncomputed", f"job {jid} {status} after {attempts} attempts")
        else:
            report.info["team_jobs_done"] += 1
    return report


def database_state(conn: sa.Connection) -> dict[str, str]:
    """A digest of every table of the public schema and of its columns, indexes and triggers: what a refused
    command must leave exactly as it was."""
    state: dict[str, str] = {}
    tables = [name for (name,) in conn.exec_driver_sql(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY 1")]
    for name in tables:
        state[name] = str(conn.exec_driver_sql(
            f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {_quoted(name)} AS t"  # noqa: S608
        ).scalar())
    state["(columns, indexes, triggers)"] = str(conn.exec_driver_sql(
        "SELECT md5(coalesce(string_agg(x, '|' ORDER BY x), '')) FROM ("
        "SELECT c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod) AS x "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped "
        "UNION ALL SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' "
        "UNION ALL SELECT tgrelid::regclass::text || ':' || tgname FROM pg_trigger WHERE NOT tgisinternal) AS s"
    ).scalar())
    return state


def _quoted(name: str) -> str:
    """A table name read from the catalog, as an identifier."""
    return '"' + name.replace('"', '""') + '"'


def changed_tables(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


def bookkeeping_texts(conn: sa.Connection) -> Iterator[tuple[str, str]]:
    """(table, every row as text) of what the product keeps: its `ba_` tables and the outbox."""
    names = [name for (name,) in conn.exec_driver_sql(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') "
        "AND (left(c.relname, 3) = 'ba_' OR c.relname = 'outbox_events') ORDER BY 1")]
    for name in names:
        text = conn.exec_driver_sql(
            f"SELECT coalesce(string_agg(t::text, chr(10)), '') FROM {_quoted(name)} AS t"  # noqa: S608
        ).scalar()
        yield name, str(text or "")


_CODE = re.compile(r"zq[0-9a-f]{14}")
_POINTS = re.compile(r"(?<![0-9])[0-9]{9}(?![0-9])")


@dataclass(frozen=True)
class Canaries:
    """Values that may be nowhere but the team's table and the environment: each row's `code` (`zq` + 14 hex
    digits) and `points` (9 digits), and the encryption key. `found` names what it found, never the value."""

    codes: frozenset[str]
    points: frozenset[str]
    key: str

    @staticmethod
    def code(rng: Any) -> str:
        return "zq" + "".join(rng.choice("0123456789abcdef") for _ in range(14))

    def found(self, text: str) -> list[str]:
        what = []
        if self.key and self.key in text:
            what.append("the encryption key")
        if any(m in self.codes for m in _CODE.findall(text)):
            what.append("a row's value (code)")
        if any(m in self.points for m in _POINTS.findall(text)):
            what.append("a row's value (points)")
        return what


@dataclass
class DeclarationOutcome:
    """What one hostile declaration came to: the outcome expected, each command's, the problems (if any)."""

    case: str
    title: str
    component: str
    expected: str
    known: str = ""
    observed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
