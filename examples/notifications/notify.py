"""The notifications queue's handler: called once per row with the declared columns and `attempts`.

Returning means DONE; `batch_assets.PermanentFailure` means FAILED at once; any other exception is
transient (tried again after the backoff, FAILED after max_attempts). This one appends what it sends
to the file NOTIFICATIONS_SENT (default sent.jsonl) instead of calling a real mail service.
"""

import json
import os

from batch_assets import PermanentFailure


def send(*, id: int, recipient: str, body: str, attempts: int) -> None:
    if "@" not in recipient:
        raise PermanentFailure(f"not an address: {recipient!r}")
    with open(os.environ.get("NOTIFICATIONS_SENT", "sent.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps({"id": id, "recipient": recipient, "attempts": attempts}) + "\n")
