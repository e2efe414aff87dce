"""Hostile date-of-birth values (docs/reference/formats.md, docs/reference/rules.md): the strict parse, the decrypt
and the sweep's outcome of each."""

from __future__ import annotations

import os
import uuid
from datetime import date

import pytest

from batch_assets.errors import ConfigError, DecryptError
from batch_assets.reference.customer_status.crypto import DobCipher
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, parse_dob
from batch_assets.reference.customer_status.sweep import AUTHENTIC_LONG, MAX_VALUE_BYTES, CustomerStatusSweep

pytestmark = pytest.mark.unit

RUN_DATE = date(2025, 6, 1)
SETTLED = date(2031, 1, 5)
"""A stored next_review_date after the run date: a failed row must not keep it."""

NOT_A_DOB = [
    " 990-01-01",  # int() strips spaces
    "1_90-01-01",  # int() takes underscores
    "+990-01-01",  # int() takes a sign
    "-990-01-01",
    "١٩٩٠-٠١-٠١",  # Arabic-Indic digits: int() takes every Unicode digit
    "１９９０-０１-０１",  # fullwidth digits
    "1990-01-01\n",  # a trailing newline
    "1990-01-01 ",
    "1990-1-01",
    "19900-01-01",  # 11 characters
    "1990/01/01",
    "0000-01-01",  # year 0 does not exist
    "2023-02-29",  # 29 February of a common year
    "1990-13-01",
    "",
]


def test_parse_accepts_exactly_ascii_yyyy_mm_dd_of_a_real_date() -> None:
    """parse_dob takes YYYY-MM-DD in ASCII digits of a real date and nothing else: every hostile text is a ValueError
    (int() alone takes spaces, underscores, signs and every Unicode digit)."""
    refused = []
    for text in NOT_A_DOB:
        try:
            parse_dob(text)
        except ValueError:
            refused.append(text)
    assert refused == NOT_A_DOB
    assert parse_dob("1990-01-01") == date(1990, 1, 1)
    assert parse_dob("2024-02-29") == date(2024, 2, 29)
    assert parse_dob("0001-01-01") == date(1, 1, 1)


def test_non_ascii_plaintext_decrypts_and_is_not_a_decrypt_failure(cipher: DobCipher) -> None:
    """A ciphertext that authenticates decrypts whatever its plaintext holds; only bad ciphertexts raise."""
    cid = uuid.uuid4()
    blob = cipher.encrypt(cid, "١٩٩٠-٠١-٠١".encode())
    assert cipher.decrypt(cid, blob) == "١٩٩٠-٠١-٠١".encode()
    assert cipher.decrypt_text(cid, blob) == "١٩٩٠-٠١-٠١"
    latin1 = cipher.encrypt(cid, b"\xff\xfe")
    assert cipher.decrypt_text(cid, latin1) == "\ufffd\ufffd"


@pytest.mark.parametrize("blob", [b"", b"\x00" * 27, os.urandom(38), os.urandom(200)],
                         ids=["empty", "27 zero bytes", "38 random bytes", "200 random bytes"])
def test_short_or_garbage_ciphertext_is_a_decrypt_error(cipher: DobCipher, blob: bytes) -> None:
    """Empty, too short or random bytes do not authenticate: DecryptError, never a plaintext."""
    with pytest.raises(DecryptError):
        cipher.decrypt(uuid.uuid4(), blob)


def _sweep(cipher: DobCipher) -> CustomerStatusSweep:
    return CustomerStatusSweep("full", cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES)


def _row(cid: uuid.UUID, blob: bytes | None, size: int | None = None) -> tuple:
    """A row as the sweep reads it, stored ADULT with a future date: (id, dob, category, date, failure, bytes)."""
    return (cid, blob, "ADULT", SETTLED, None, len(blob) if size is None and blob is not None else size)


def _assert_failed_and_due(outcome, kind: str) -> None:
    assert outcome.failure == kind
    _, _, _, old_category, old_date, _, new_category, new_date, failure, trigger = outcome.change
    assert (old_category, old_date) == ("ADULT", SETTLED)
    assert (new_category, new_date, failure, trigger) == ("ADULT", None, kind, None)  # category kept, made due


@pytest.mark.parametrize("text", [t for t in NOT_A_DOB if t] + ["2025-06-02", "9999-12-31"])
def test_every_hostile_plaintext_is_invalid_value_and_left_due(cipher: DobCipher, text: str) -> None:
    """A ciphertext of anything but a real date on or before the run date is invalid_value; the row is made due."""
    cid = uuid.uuid4()
    outcome = _sweep(cipher).compute(_row(cid, cipher.encrypt(cid, text.encode())))
    _assert_failed_and_due(outcome, "invalid_value")
    assert outcome.decrypted == 1


def test_non_utf8_plaintext_is_invalid_value(cipher: DobCipher) -> None:
    """Plaintext bytes that are not even text are invalid_value (they decrypted: the key is fine)."""
    cid = uuid.uuid4()
    _assert_failed_and_due(_sweep(cipher).compute(_row(cid, cipher.encrypt(cid, b"\xff" * 10))), "invalid_value")


def test_empty_ciphertext_is_missing_data_without_a_decrypt(cipher: DobCipher) -> None:
    """b'' is "unknown" (missing_data), not a key problem: no decrypt, and it does not feed the breaker."""
    outcome = _sweep(cipher).compute(_row(uuid.uuid4(), b""))
    _assert_failed_and_due(outcome, "missing_data")
    assert outcome.decrypted == 0


def test_value_longer_than_the_bound_is_judged_by_whether_it_authenticates(cipher: DobCipher) -> None:
    """A value the page did not return (longer than max_value_bytes) is decrypt_failure when the reader found it does
    not authenticate (NULL and its length), invalid_value when it does (its plaintext is no date); both left due."""
    outcome = _sweep(cipher).compute(_row(uuid.uuid4(), None, size=2_000_000))
    _assert_failed_and_due(outcome, "decrypt_failure")
    assert outcome.decrypted == 1
    authentic = _sweep(cipher).compute(_row(uuid.uuid4(), AUTHENTIC_LONG, size=2_000_000))
    _assert_failed_and_due(authentic, "invalid_value")
    assert authentic.change[1] is None, "what the page write compares: the value's length only"
    assert MAX_VALUE_BYTES == 1024


def test_a_long_ciphertext_is_authenticated_part_by_part(cipher: DobCipher) -> None:
    """`authenticates` over a ciphertext in parts: True for this row's, False for another row's or altered bytes."""
    cid = uuid.uuid4()
    blob = cipher.encrypt(cid, b"1990-01-01" + b" " * 5000)
    nonce, body, tag = blob[:12], blob[12:-16], blob[-16:]
    parts = [body[i:i + 1000] for i in range(0, len(body), 1000)]
    assert cipher.authenticates(cid, nonce, tag, iter(parts))
    assert not cipher.authenticates(uuid.uuid4(), nonce, tag, iter(parts))
    assert not cipher.authenticates(cid, nonce, tag, iter([*parts[:-1], parts[-1][:-1] + b"x"]))


@pytest.mark.parametrize("kind", ["copied", "random", "short"])
def test_decrypt_failure_is_left_due_too(cipher: DobCipher, kind: str) -> None:
    """A ciphertext of another row, random bytes or a cut one is decrypt_failure, and the row is made due."""
    cid = uuid.uuid4()
    other = cipher.encrypt_text(uuid.uuid4(), "1990-01-01")
    blob = {"copied": other, "random": os.urandom(38), "short": other[:20]}[kind]
    _assert_failed_and_due(_sweep(cipher).compute(_row(cid, blob)), "decrypt_failure")


def test_max_value_bytes_is_bounded() -> None:
    """The byte bound is a setting with limits: never below a valid ciphertext (38 bytes), at most 1 MiB."""
    cipher = DobCipher(os.urandom(32))
    with pytest.raises(ConfigError, match="max_value_bytes"):
        CustomerStatusSweep("full", cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES, max_value_bytes=37)
    with pytest.raises(ConfigError, match="max_value_bytes"):
        CustomerStatusSweep("full", cipher=cipher, run_date=RUN_DATE, rules=DEFAULT_RULES, max_value_bytes=2**21)
