"""The other services beside the jobs (docs/reference/tables.md): connections of the campaign's own that write
the product's tables while its jobs run.

- `DobEditor`: rewrites `customers.encrypted_dob` of random rows to valid ciphertexts of other dates
  (encrypted here, as docs/reference/formats.md says), at a steady rate, on one connection of its own, in a thread.
- `inject_hostile_customers` / `inject_hostile_payments`: rows of every hostile kind a writer may
  store, inserted or written over settled rows.

Dates written here are never printed: the report names kinds and categories only.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from faults import checker

EDIT_DOB_SQL = "UPDATE customers SET encrypted_dob = %(blob)s WHERE id = %(id)s AND status = 'ACTIVE'"
EDITS_PER_TICK_MAX = 40  # a tick that fell behind catches up by at most this many edits
TICK_S = 0.01


def random_dob(rng: random.Random, run_date: date) -> date:
    """A date of birth 0-100 years before the run date (every category of the default rules)."""
    return run_date - timedelta(days=rng.randrange(1, 100 * 366))


class DobEditor(threading.Thread):
    """Another service editing dates of birth at `rate` edits/s until `stop()`; every edit in `edits`."""

    def __init__(self, engine: sa.Engine, key_text: str, ids: list[uuid.UUID], run_date: date, *,
                 rate: float, seed: int) -> None:
        super().__init__(name="faults-dob-editor", daemon=True)
        self.engine = engine
        self.aead = AESGCM(checker.decode_key(key_text))
        self.ids = ids
        self.run_date = run_date
        self.rate = rate
        self.rng = random.Random(seed)
        self.edits = checker.Edits()
        self.dobs: set[str] = set()  # every date written, for the campaign's secret scan (never printed)
        self.errors = 0
        self.elapsed_s = 0.0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def edit_one(self, conn: sa.Connection, cid: uuid.UUID) -> None:
        text = random_dob(self.rng, self.run_date).isoformat()
        blob = checker.encrypt_bytes(self.aead, cid, text.encode())
        if conn.exec_driver_sql(EDIT_DOB_SQL, {"blob": blob, "id": cid}).rowcount:
            with self._lock:
                self.edits.add(cid, blob)
                self.dobs.add(text)

    def run(self) -> None:
        started = time.monotonic()
        done = 0
        while not self._halt.is_set():
            try:
                with self.engine.connect() as conn:  # autocommit: each edit commits on its own
                    while not self._halt.is_set():
                        due = min(EDITS_PER_TICK_MAX, int((time.monotonic() - started) * self.rate) - done)
                        for _ in range(max(0, due)):
                            self.edit_one(conn, self.rng.choice(self.ids))
                            done += 1
                        self._halt.wait(TICK_S)  # pacing: ~rate edits per second
            except sa.exc.SQLAlchemyError:
                self.errors += 1  # a cut connection (deadlock victim, server restart): reconnect and go on
                self._halt.wait(0.2)
        self.elapsed_s = time.monotonic() - started

    def stop(self) -> checker.Edits:
        self._halt.set()
        self.join(timeout=30)
        return self.edits


# --- hostile rows -------------------------------------------------------------------------

# (name shown in the report, the outcome the rule gives it, the plaintext or a builder of the blob)
# A builder gets (aead, customer id, run date, a ciphertext of another row).
Builder = Callable[[AESGCM, uuid.UUID, date, bytes], bytes | None]


def _plain(text: bytes) -> Builder:
    return lambda aead, cid, run_date, donor: checker.encrypt_bytes(aead, cid, text)


def _another_key(aead: AESGCM, cid: uuid.UUID, run_date: date, donor: bytes) -> bytes:
    return checker.encrypt_bytes(AESGCM(AESGCM.generate_key(bit_length=256)), cid, b"1990-01-01")


HOSTILE_CUSTOMERS: tuple[tuple[str, str, Builder], ...] = (
    ("empty ciphertext (b'')", "missing_data", lambda aead, cid, rd, donor: b""),
    ("NULL ciphertext", "missing_data", lambda aead, cid, rd, donor: None),
    ("40 random bytes", "decrypt_failure", lambda aead, cid, rd, donor: random.randbytes(40)),
    ("ciphertext copied from another row (AAD mismatch)", "decrypt_failure", lambda aead, cid, rd, donor: donor),
    ("ciphertext under another key", "decrypt_failure", _another_key),
    ("ciphertext truncated to 20 bytes", "decrypt_failure", lambda aead, cid, rd, donor: donor[:20]),
    ("2 MB value (a valid ciphertext of a date + 2 MB)", "invalid_value", _plain(b"1990-01-01" + b" " * 2_000_000)),
    ("' 990-01-01'", "invalid_value", _plain(b" 990-01-01")),
    ("'1_90-01-01'", "invalid_value", _plain(b"1_90-01-01")),
    ("'\u0661\u0669\u0669\u0660-\u0660\u0661-\u0660\u0661' (Arabic-Indic digits, UTF-8)", "invalid_value",
     _plain("\u0661\u0669\u0669\u0660-\u0660\u0661-\u0660\u0661".encode())),
    ("'\uff11\uff19\uff19\uff10-\uff10\uff11-\uff10\uff11' (full-width digits, UTF-8)", "invalid_value",
     _plain("\uff11\uff19\uff19\uff10-\uff10\uff11-\uff10\uff11".encode())),
    ("'1990-02-30'", "invalid_value", _plain(b"1990-02-30")),
    ("'0000-01-01'", "invalid_value", _plain(b"0000-01-01")),
    ("'19900101' (ISO basic format)", "invalid_value", _plain(b"19900101")),
    ("'1990-01-01\\n'", "invalid_value", _plain(b"1990-01-01\n")),
    ("an encrypted empty plaintext", "invalid_value", _plain(b"")),
    ("a date after the run date", "invalid_value",
     lambda aead, cid, rd, donor: checker.encrypt_bytes(aead, cid, (rd + timedelta(days=1)).isoformat().encode())),
    ("born on the run date (valid: age 0)", "computed",
     lambda aead, cid, rd, donor: checker.encrypt_bytes(aead, cid, rd.isoformat().encode())),
)
"""Every hostile `encrypted_dob` a writer may store, and the campaign's own."""

VARIANTS = {
    "new": "inserted, never computed",
    "edited": "written over a settled row (category kept, next_review_date cleared by the trigger)",
    "preset": "inserted holding a category and a future next_review_date",
}
PRESET_CATEGORY = "ADULT"
PRESET_AHEAD_DAYS = 400

INSERT_CUSTOMER_SQL = ("INSERT INTO customers (id, status, encrypted_dob, age_category, next_review_date) "
                       "VALUES (%(id)s, 'ACTIVE', %(blob)s, %(cat)s, %(nrd)s)")
EDIT_SETTLED_SQL = ("UPDATE customers SET encrypted_dob = %(blob)s WHERE id = %(id)s AND status = 'ACTIVE' "
                    "RETURNING age_category")
SETTLED_SQL = ("SELECT id FROM customers WHERE status = 'ACTIVE' AND age_category IS NOT NULL "
               "AND next_review_date > %(rd)s ORDER BY md5(id::text || %(seed)s) LIMIT %(n)s")
DONOR_SQL = ("SELECT id, encrypted_dob FROM customers WHERE encrypted_dob IS NOT NULL "
             "AND octet_length(encrypted_dob) = 38 LIMIT 2")
"""Two rows holding a ciphertext of a date (12-byte nonce, 10 bytes, 16-byte tag) to stand for "another row's":
two, so a row written over is never given its own ciphertext back (which would decrypt)."""
NO_DONOR = b"\0" * 38


def inject_hostile_customers(engine: sa.Engine, key_text: str, run_date: date, *, variants: tuple[str, ...],
                             seed: int) -> list[checker.HostileRow]:
    """One row of each hostile kind per variant, each statement committed on its own (as a writer would)."""
    aead = AESGCM(checker.decode_key(key_text))
    rows: list[checker.HostileRow] = []
    with engine.connect() as conn:  # autocommit
        donors = [(row_id, bytes(blob)) for row_id, blob in conn.exec_driver_sql(DONOR_SQL)]
        settled = [r[0] for r in conn.exec_driver_sql(
            SETTLED_SQL, {"rd": run_date, "seed": str(seed), "n": len(HOSTILE_CUSTOMERS)})]
        for variant in variants:
            for i, (kind, expected, build) in enumerate(HOSTILE_CUSTOMERS):
                if variant == "edited":
                    if i >= len(settled):
                        continue
                    cid = settled[i]
                    donor = next((blob for row_id, blob in donors if row_id != cid), NO_DONOR)
                    held = conn.exec_driver_sql(
                        EDIT_SETTLED_SQL, {"blob": build(aead, cid, run_date, donor), "id": cid}).scalar()
                    rows.append(checker.HostileRow(kind, expected, cid, variant, held))
                    continue
                cid = uuid.uuid4()
                donor = donors[0][1] if donors else NO_DONOR
                cat = PRESET_CATEGORY if variant == "preset" else None
                nrd = run_date + timedelta(days=PRESET_AHEAD_DAYS) if variant == "preset" else None
                conn.exec_driver_sql(INSERT_CUSTOMER_SQL, {"id": cid, "blob": build(aead, cid, run_date, donor),
                                                           "cat": cat, "nrd": nrd})
                rows.append(checker.HostileRow(kind, expected, cid, variant, cat))
    return rows


# (name, status, attempts, claimed_until relative to now in seconds or None, extra columns)
HOSTILE_PAYMENTS: tuple[tuple[str, str, int, float | None, dict[str, int]], ...] = (
    ("PROCESSING, claimed_until NULL", "PROCESSING", 1, None, {}),
    ("PROCESSING, claimed_until NULL, attempts 0", "PROCESSING", 0, None, {}),
    ("PROCESSING, claim lapsed an hour ago", "PROCESSING", 1, -3600.0, {}),
    ("NEW, attempts = the maximum (5)", "NEW", 5, None, {}),
    ("NEW, attempts 50 (over the maximum)", "NEW", 50, None, {}),
    ("NEW, attempts -1", "NEW", -1, None, {}),
    ("NEW, a claimed_until left in the future", "NEW", 0, 86_400.0, {}),
    ("NEW, priority 32767", "NEW", 0, None, {"priority": 32767}),
    ("NEW, priority -32768", "NEW", 0, None, {"priority": -32768}),
    ("NEW, amount_cents -1", "NEW", 0, None, {"amount_cents": -1}),
    ("NEW, amount_cents 2^63-1", "NEW", 0, None, {"amount_cents": 2**63 - 1}),
    ("NEW, next_attempt_at in 2000", "NEW", 0, None, {"long_ago": 1}),
)
"""Every hostile payment row a writer may store, and the campaign's own (docs/guide/payment-queue.md)."""
PAYMENTS_PER_KIND = 2

INSERT_PAYMENT_SQL = (
    "INSERT INTO payments (id, amount_cents, status, attempts, next_attempt_at, claimed_until, priority) "
    "VALUES (%(id)s, %(amount)s, %(status)s, %(attempts)s, %(next)s, %(claimed)s, %(priority)s)"
)


def inject_hostile_payments(engine: sa.Engine) -> list[checker.HostileRow]:
    rows: list[checker.HostileRow] = []
    now = datetime.now(UTC)
    with engine.connect() as conn:  # autocommit
        for kind, status, attempts, claimed, extra in HOSTILE_PAYMENTS:
            for _ in range(PAYMENTS_PER_KIND):
                pid = uuid.uuid4()
                conn.exec_driver_sql(INSERT_PAYMENT_SQL, {
                    "id": pid, "amount": extra.get("amount_cents", 1234), "status": status, "attempts": attempts,
                    "next": datetime(2000, 1, 1, tzinfo=UTC) if extra.get("long_ago") else now,
                    "claimed": None if claimed is None else now + timedelta(seconds=claimed),
                    "priority": extra.get("priority", 0),
                })
                rows.append(checker.HostileRow(kind, "DONE", pid, status, None))
    return rows

