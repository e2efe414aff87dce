"""The file sink: JSON lines appended to a file, fsynced before the batch counts as sent."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from batch_assets.outbox.event import OutboxEvent, bodies_of


class JsonLinesSink:
    """Appends one JSON object per event to a file, flushed and fsynced before returning."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def send_batch(self, events: Sequence[OutboxEvent]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(body.decode() + "\n" for body in bodies_of(events))
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())

    def close(self) -> None:
        """Nothing is held open between batches."""

    def __repr__(self) -> str:
        return f"JsonLinesSink({str(self.path)!r})"
