"""The encrypted date of birth (docs/reference/formats.md).

`encrypted_dob` = 12-byte nonce ‖ AES-256-GCM(ciphertext ‖ tag) of ASCII
`YYYY-MM-DD`, with the customer's 16 id bytes as associated data. One cipher
object per process and key. Neither keys nor plaintexts ever appear in a
message raised from here.
"""

from __future__ import annotations

import base64
import binascii
import os
import sys
import uuid
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from batch_assets import ENCRYPTION_KEY_VAR, ConfigError, DecryptError, Settings

NONCE_BYTES = 12
TAG_BYTES = 16
KEY_BYTES = 32
DEV_KEY_FILE = "dev.key"


def decode_key(text: str) -> bytes:
    """Decode a URL-safe base64 key; a malformed one is a `ConfigError` that does not echo it."""
    padded = text.strip() + "=" * (-len(text.strip()) % 4)
    try:
        key = base64.urlsafe_b64decode(padded.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ConfigError("is not valid URL-safe base64", field=ENCRYPTION_KEY_VAR) from None
    if len(key) != KEY_BYTES:
        raise ConfigError(f"must decode to {KEY_BYTES} bytes, got {len(key)}", field=ENCRYPTION_KEY_VAR)
    return key


def generate_key_text() -> str:
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def load_key(settings: Settings) -> bytes:
    """The key of the environment (docs/reference/environment.md): the variable, or in embedded mode a generated dev
    key."""
    if settings.encryption_key is not None:
        return decode_key(settings.encryption_key)
    if not settings.embedded:
        raise ConfigError(
            "is not set; it is required when BATCH_ASSETS_DATABASE_URL is set", field=ENCRYPTION_KEY_VAR
        )
    return decode_key(_dev_key_text(settings.home))


def _dev_key_text(home: Path) -> str:
    path = home / DEV_KEY_FILE
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(generate_key_text())
        print(
            f"warning: {ENCRYPTION_KEY_VAR} is not set; generated a development key in {path} "
            "(embedded mode only; set the variable for real data)",
            file=sys.stderr,
        )
    return path.read_text().strip()


class DobCipher:
    """Encrypts and decrypts dates of birth bound to their customer id."""

    __slots__ = ("_aead", "_key")

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ConfigError(f"must be {KEY_BYTES} bytes", field=ENCRYPTION_KEY_VAR)
        self._aead = AESGCM(key)
        self._key = key

    def __repr__(self) -> str:  # never show the key
        return "DobCipher(<key hidden>)"

    def encrypt(self, customer_id: uuid.UUID, plain: bytes, nonce: bytes | None = None) -> bytes:
        """nonce ‖ AES-256-GCM(plain) with the id as associated data, whatever `plain` holds (tests of
        hostile rows write plaintexts other services might)."""
        nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
        return nonce + self._aead.encrypt(nonce, plain, customer_id.bytes)

    def encrypt_text(self, customer_id: uuid.UUID, text: str, nonce: bytes | None = None) -> bytes:
        return self.encrypt(customer_id, text.encode("ascii"), nonce)

    def decrypt(self, customer_id: uuid.UUID, blob: bytes) -> bytes:
        """The plaintext bytes, whatever they hold; raises `DecryptError` (without any secret in it) when the
        ciphertext does not authenticate under the key and this row's id (too short, corrupt, copied from
        another row, another key). Whether the plaintext is a date is the caller's question."""
        if len(blob) < NONCE_BYTES + TAG_BYTES:
            raise DecryptError("ciphertext too short")
        try:
            return self._aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], customer_id.bytes)
        except InvalidTag:
            raise DecryptError("authentication failed (wrong key, wrong row or corrupt bytes)") from None

    def authenticates(self, customer_id: uuid.UUID, nonce: bytes, tag: bytes, body: Iterable[bytes]) -> bool:
        """Whether a ciphertext too long to hold at once (its nonce, its body in parts, in order, and its tag)
        authenticates under the key and this row's id. The plaintext is never kept: each part's is dropped."""
        if len(nonce) != NONCE_BYTES or len(tag) != TAG_BYTES:
            return False
        decryptor = Cipher(algorithms.AES(self._key), modes.GCM(nonce, tag)).decryptor()
        decryptor.authenticate_additional_data(customer_id.bytes)
        for part in body:
            decryptor.update(part)
        try:
            decryptor.finalize()
        except InvalidTag:
            return False
        return True

    def seal(self, plain: bytes, associated: bytes) -> bytes:
        """nonce ‖ AES-256-GCM(plain) under the same key, bound to `associated` instead of a customer id (what the
        sweep keeps beside the rows that no one may read, e.g. a checkpoint's cursor). A fixed associated text
        longer than an id keeps the two apart: a sealed value never decrypts as a date of birth, nor the reverse."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plain, associated)

    def unseal(self, blob: bytes, associated: bytes) -> bytes:
        """What `seal` sealed with `associated`; raises `DecryptError` (without any secret in it) otherwise."""
        if len(blob) < NONCE_BYTES + TAG_BYTES:
            raise DecryptError("sealed value too short")
        try:
            return self._aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], associated)
        except InvalidTag:
            raise DecryptError("authentication failed (wrong key or altered value)") from None

    def decrypt_text(self, customer_id: uuid.UUID, blob: bytes) -> str:
        """The plaintext as text; raises `DecryptError` only when it does not decrypt (see `decrypt`).

        Bytes that are not UTF-8 become U+FFFD: a plaintext that decrypts is never a decrypt failure,
        and the strict `YYYY-MM-DD` parse refuses anything that is not ASCII digits and dashes."""
        return self.decrypt(customer_id, blob).decode("utf-8", errors="replace")


@lru_cache(maxsize=4)
def cipher_for(key: bytes) -> DobCipher:
    """One cipher object per process and key."""
    return DobCipher(key)


def cipher_from_settings(settings: Settings) -> DobCipher:
    """The cipher of the configured key (ConfigError, exit 2, when it is missing or malformed)."""
    return cipher_for(load_key(settings))
