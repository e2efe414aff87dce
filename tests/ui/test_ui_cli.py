"""`batch-assets ui` and `make ui` (dg dev) with real processes: a quiet start-up, and SIGTERM stops everything.

The webserver, the daemon and the code servers are children of dg dev; SIGTERM sent to the command the user
started (not to its group) must still leave none of them running.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from ui_server import UiServer, wait_gone

from batch_assets.cli.ui import still_running

pytestmark = [pytest.mark.dagster, pytest.mark.slow]

# A stop takes dg dev a few seconds (it waits for its daemon threads and code servers); the CLI kills the rest
# after its own 30 s.
STOP_TIMEOUT_S = 60.0

NOTICE = re.compile(r"(BetaWarning|PreviewWarning|SupersessionWarning|is superseded|is currently in (beta|preview))")


@pytest.mark.parametrize("make", [False, True], ids=["batch-assets ui", "make ui"])
def test_the_ui_starts_without_api_notices_and_sigterm_stops_every_process_it_started(
    start_ui: Callable[..., AbstractContextManager[UiServer]], make: bool
) -> None:
    with start_ui(make=make) as server:
        processes = server.note_descendants()
        commands = " ".join(" ".join(p.cmdline()) for p in still_running(processes))
        # dg dev (not the superseded `dagster dev`), with its webserver, daemon and code server under it.
        assert "dagster_dg_cli.cli dev" in commands and "dagster_webserver" in commands, commands
        assert "dagster._daemon" in commands and "code-server" in commands, commands
        notices = [line for line in server.output().splitlines() if NOTICE.search(line)]
        assert notices == [], "\n".join(notices)

        server.popen.send_signal(signal.SIGTERM)  # to the command only, as a service manager or `kill PID` does
        left = wait_gone([*processes, *server.note_descendants()], STOP_TIMEOUT_S)
        assert left == [], f"still running after SIGTERM: {[(p.pid, p.name()) for p in left]}\n{server.output()}"
        assert server.popen.wait(timeout=STOP_TIMEOUT_S) != 0
        assert "stopping the Dagster UI" in server.output()
