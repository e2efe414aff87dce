"""Invariants from independent checks: nothing here imports the product's engine or runner.

Dates of birth are decrypted with `cryptography` directly as CONTRACT §4 describes
(12-byte nonce ‖ AES-256-GCM, the customer's 16 id bytes as associated data), and
the age-category rule of CONTRACT §5 is computed by this module's own code, so a
bug in the product's rule cannot hide itself.

What is checked, against a `Baseline` taken before the fault:
- customers: every ACTIVE row equals the rule for the run date; a row that cannot be
  evaluated keeps its category and stays due;
- one review trigger and one outbox event per transition (baseline → now), none for
  a row that did not change;
- payments: every one DONE, and DONE once (the campaign's audit trigger logs every
  write of DONE), at most 2 accepted POSTs per Idempotency-Key at the stub;
- subscriptions all-or-nothing: EXPIRED ⇒ no enrollments, ACTIVE/FAILED ⇒ the
  enrollments it had.
"""

from __future__ import annotations

import base64
import calendar
import re
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import sqlalchemy as sa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SENTINEL = date(9999, 12, 31)
DEFAULT_RULES: tuple[tuple[str, int], ...] = (("MINOR", 0), ("YOUNG_ADULT", 18), ("ADULT", 26), ("SENIOR", 65))
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
MAX_ACCEPTED_POSTS = 2
DETAILS = 5  # examples kept per kind of violation

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


# --- CONTRACT §4 and §5, written here -----------------------------------------------


def decode_key(text: str) -> bytes:
    padded = text.strip() + "=" * (-len(text.strip()) % 4)
    return base64.urlsafe_b64decode(padded.encode("ascii"))


def decrypt_dob(aead: AESGCM, customer_id: uuid.UUID, blob: bytes | None) -> str | None:
    """The plaintext, or None when it does not decrypt (wrong key, row or bytes)."""
    if blob is None or len(blob) <= 12 + 16:
        return None
    try:
        plain = aead.decrypt(blob[:12], blob[12:], customer_id.bytes)
        return plain.decode("ascii")
    except (InvalidTag, UnicodeDecodeError):
        return None


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
    """The expected result, or the failure kind of a row that cannot be evaluated."""
    if blob is None:
        return "missing_data"
    text = decrypt_dob(aead, cid, bytes(blob))
    if text is None:
        return "decrypt_failure"
    if not _DATE.fullmatch(text):
        return "invalid_value"
    try:
        dob = date.fromisoformat(text)
    except ValueError:
        return "invalid_value"
    if dob > run_date:
        return "invalid_value"
    return rule(dob, run_date, rules)


# --- baseline and reports ----------------------------------------------------------


@dataclass
class Baseline:
    """What the tables held before the fault."""

    categories: dict[uuid.UUID, str | None] = field(default_factory=dict)
    trigger_max_id: int = 0
    outbox_max_id: int = 0
    enrollments: dict[int, int] = field(default_factory=dict)
    subscription_status: dict[int, str] = field(default_factory=dict)


def take_baseline(conn: sa.Connection) -> Baseline:
    b = Baseline()
    for cid, cat in conn.exec_driver_sql("SELECT id, age_category FROM customers WHERE status = 'ACTIVE'"):
        b.categories[cid] = cat
    b.trigger_max_id = int(conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM review_triggers").scalar())
    b.outbox_max_id = int(conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM outbox_events").scalar())
    for sid, status, n in conn.exec_driver_sql(
        "SELECT s.id, s.status, count(e.id) FROM subscriptions s LEFT JOIN enrollments e ON e.subscription_id = s.id "
        "GROUP BY s.id, s.status"
    ):
        b.enrollments[sid] = int(n)
        b.subscription_status[sid] = status
    return b


@dataclass
class Report:
    """Violations by kind (a count and a few examples each) plus counters that are not violations."""

    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    info: Counter[str] = field(default_factory=Counter)

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

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def rows_lost(self) -> int:
        return sum(n for k, n in self.violations.items() if k in LOST_KINDS)

    @property
    def duplicates(self) -> int:
        return sum(n for k, n in self.violations.items() if k in DUPLICATE_KINDS)

    def describe(self) -> str:
        parts = []
        for kind, n in sorted(self.violations.items()):
            parts.append(f"{kind}={n} (e.g. {'; '.join(self.examples.get(kind, [])[:2])})")
        return ", ".join(parts) or "ok"


LOST_KINDS = {"wrong_category", "wrong_next_review", "uncomputed", "failed_row_not_due", "failed_row_category_changed",
              "missing_trigger", "missing_event", "payment_not_done", "subscription_not_expired",
              "subscription_partial", "event_not_sent"}
DUPLICATE_KINDS = {"duplicate_trigger", "duplicate_event", "trigger_without_transition", "event_without_transition",
                   "payment_done_twice", "payment_posts_over_limit"}


def check_customers(conn: sa.Connection, key_text: str, run_date: date, rules: Sequence[tuple[str, int]],
                    baseline: Baseline) -> Report:
    """Every ACTIVE row against the rule; one trigger and one event per transition since the baseline."""
    aead = AESGCM(decode_key(key_text))
    report = Report()
    transitions: dict[uuid.UUID, tuple[str | None, str, date | None]] = {}
    result = conn.execution_options(stream_results=True, max_row_buffer=5000).exec_driver_sql(
        "SELECT id, encrypted_dob, age_category, next_review_date FROM customers WHERE status = 'ACTIVE'"
    )
    for cid, blob, cat, nrd in result:
        before = baseline.categories.get(cid)
        expected = evaluate_row(aead, cid, blob, run_date, rules)
        if isinstance(expected, str):
            report.info["unevaluable"] += 1
            report.info[f"unevaluable_{expected}"] += 1
            if nrd is not None and nrd > run_date:
                report.add("failed_row_not_due", f"{cid} ({expected}) next_review_date {nrd}")
            if cat != before:
                report.add("failed_row_category_changed", f"{cid} ({expected}) {before} -> {cat}")
            continue
        if (cat, nrd) != (expected.category, expected.next_review_date):
            if nrd is None or nrd <= run_date:
                # Left due: the next delta would still repair it, but a SUCCESS run that left it is untruthful.
                report.add("uncomputed", f"{cid} left due: stored ({cat}, {nrd}) expected {expected.category}")
            elif cat != expected.category:
                # Not due: no delta will ever look at it again.
                report.add("wrong_category", f"{cid} stored {cat} expected {expected.category} (not due: {nrd})")
            else:
                report.add("wrong_next_review", f"{cid} stored {nrd} expected {expected.next_review_date}")
        if cat != before:
            # A written transition (counted once as a row problem above when it is the wrong one).
            since = expected.since if cat == expected.category else None
            transitions[cid] = (before, cat, since)
    report.info["transitions"] = len(transitions)
    _check_side_effects(conn, baseline, transitions, report)
    return report


def _check_side_effects(conn: sa.Connection, baseline: Baseline,
                        transitions: Mapping[uuid.UUID, tuple[str | None, str, date | None]], report: Report) -> None:
    triggers: dict[uuid.UUID, list[tuple[str, str, date]]] = {}
    for cid, frm, to, eff in conn.exec_driver_sql(
        "SELECT customer_id, from_category, to_category, effective_date FROM review_triggers WHERE id > %(after)s",
        {"after": baseline.trigger_max_id},
    ):
        triggers.setdefault(cid, []).append((frm, to, eff))
    events: dict[uuid.UUID, list[tuple[Any, Any]]] = {}
    for cid, payload in conn.exec_driver_sql(
        "SELECT aggregate_id, payload FROM outbox_events WHERE id > %(after)s AND event_type = 'age_category_changed'",
        {"after": baseline.outbox_max_id},
    ):
        payload = payload if isinstance(payload, dict) else {}
        events.setdefault(cid, []).append((payload.get("from_category"), payload.get("to_category")))
    report.info["new_triggers"] = sum(len(v) for v in triggers.values())
    report.info["new_events"] = sum(len(v) for v in events.values())
    for cid, (before, after, since) in transitions.items():
        got = events.pop(cid, [])
        if not got:
            report.add("missing_event", f"{cid} {before} -> {after} has no outbox event")
        elif len(got) > 1:
            report.add("duplicate_event", f"{cid} {before} -> {after} has {len(got)} events", len(got) - 1)
        elif got[0] != (before, after):
            report.add("wrong_event", f"{cid} event {got[0]} for {before} -> {after}")
        got_t = triggers.pop(cid, [])
        if before is None:
            if got_t:
                report.add("trigger_without_transition", f"{cid} first computation got a trigger", len(got_t))
            continue
        if not got_t:
            report.add("missing_trigger", f"{cid} {before} -> {after} has no review trigger")
        elif len(got_t) > 1:
            report.add("duplicate_trigger", f"{cid} {before} -> {after} has {len(got_t)} triggers", len(got_t) - 1)
        elif got_t[0][:2] != (before, after) or (since is not None and got_t[0][2] != since):
            report.add("wrong_trigger", f"{cid} trigger {got_t[0]} expected {(before, after, since)}")
    for cid, got in events.items():
        report.add("event_without_transition", f"{cid} got {len(got)} event(s) without a transition", len(got))
    for cid, got_t in triggers.items():
        report.add("trigger_without_transition", f"{cid} got {len(got_t)} trigger(s) without a transition", len(got_t))


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
                   complete: bool) -> Report:
    """DONE once per payment (audit log), at most 2 accepted POSTs per payment; with `complete`, all DONE."""
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
        if complete and status != "DONE":
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
