"""Alerts: an error log entry, plus a JSON POST to BATCH_ASSETS_ALERT_WEBHOOK when it is set.

Payloads hold ids, names and counts only, never customer data or secrets.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0


def send_alert(text: str, payload: Mapping[str, Any], webhook: str | None) -> bool:
    """Log the alert; POST it as JSON when a webhook is configured. Returns whether a POST succeeded."""
    log.error("ALERT %s", text)
    if not webhook:
        return False
    import httpx  # only when a webhook is set: a CLI run (start-up) does not pay for the HTTP stack

    try:
        response = httpx.post(webhook, json={"text": text, **payload}, timeout=WEBHOOK_TIMEOUT_S)
        response.raise_for_status()
    except httpx.HTTPError as exc:  # the alert is already logged; a broken webhook must not fail the caller
        log.warning("alert webhook POST failed: %s", type(exc).__name__)
        return False
    return True
