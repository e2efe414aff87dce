"""The customer-status sweep's own resource: the date-of-birth key."""

# No `from __future__ import annotations`: Dagster reads the resource annotations at runtime.

import dataclasses
from collections.abc import Mapping
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from batch_assets import ENCRYPTION_KEY_VAR, Settings, env_if_set, load_settings
from batch_assets.reference.customer_status.crypto import DobCipher, cipher_for, load_key


class EncryptionResource(dg.ConfigurableResource):
    """The AES-256-GCM date-of-birth key: EnvVar BATCH_ASSETS_ENCRYPTION_KEY, or the dev key in embedded mode."""

    key: str | None = Field(
        default=None,
        description="URL-safe base64 key, set through EnvVar BATCH_ASSETS_ENCRYPTION_KEY only (never in run config).",
    )

    _cipher: DobCipher | None = PrivateAttr(default=None)

    def cipher(self) -> DobCipher:
        """The process's cipher, decoded once per resource (plan and ranges of an in-process run share it);
        a missing or malformed key is a ConfigError naming the variable."""
        if self._cipher is None:
            settings = load_settings()
            if self.key:
                settings = dataclasses.replace(settings, encryption_key=self.key)
            self._cipher = cipher_for(load_key(settings))
        return self._cipher


def encryption_resources(settings: Settings) -> Mapping[str, Any]:
    """The sweep's own resource: the key, bound by EnvVar when it is set (the dev key in embedded mode)."""
    return {"encryption": EncryptionResource(key=env_if_set(ENCRYPTION_KEY_VAR))}
