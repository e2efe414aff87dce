"""Op progress: a log line every N pages and a one-line bar on an interactive stderr."""

from __future__ import annotations

import io

import dagster as dg
import pytest

from batch_assets.orchestration.progress import OpProgress

pytestmark = pytest.mark.dagster


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_on_a_terminal_and_ends_the_line() -> None:
    """On a TTY the counters are drawn as a carriage-return bar, finished by a newline on close."""
    stream = _Tty()
    context = dg.build_op_context()
    with OpProgress(context, label="sweep", every_pages=2, total=100, stream=stream) as progress:
        progress({"scanned": 50, "changed": 10, "unchanged": 40, "failed": 0, "pages": 2})
    text = stream.getvalue()
    assert text.startswith("\rsweep [") and "50.0%" in text and "changed=10" in text
    assert text.endswith("\n")


def test_progress_stays_silent_on_a_pipe() -> None:
    """Without a terminal nothing is written to the stream (logs go through Dagster only)."""
    stream = io.StringIO()
    with OpProgress(dg.build_op_context(), label="sweep", stream=stream) as progress:
        progress({"scanned": 5, "pages": 1})
    assert stream.getvalue() == ""
