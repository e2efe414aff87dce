"""The resident launcher's wire: frames between a client and the launcher (a 4-byte length and a JSON object; the
request carries the client's stdin, stdout and stderr as descriptors, SCM_RIGHTS), and what a client's interpreter
and environment must share with the launcher's for its imports to stand for the client's."""

from __future__ import annotations

import json
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any

HANDSHAKE_TIMEOUT_S = 5.0
"""The client waits this long for the launcher to start its command before it runs the command itself."""
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "LC_", "DAGSTER_")
IMPORT_TIME_VARIABLES = ("LANG",)
"""Variables that the interpreter, the loader or a module read when it starts or is imported (Dagster reads some
of its DAGSTER_ variables at import), so the launcher's imports stand for a client only with the same values.
DAGSTER_HOME is read when the instance is opened, in the forked process: it may differ. BATCH_ASSETS_ variables
are read by the settings, in the forked process, from the client's environment."""
RUN_TIME_VARIABLES = ("DAGSTER_HOME",)
_HEADER = struct.Struct("!I")
_MAX_FRAME = 16 * 1024 * 1024


def send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    frame = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [frame], list(fds)) if fds else sock.send(frame)
    if sent < len(frame):
        sock.sendall(frame[sent:])


class Frames:
    """Reads frames from a socket; the descriptors that came with them are kept in `fds`."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.fds: list[int] = []

    def read(self) -> dict[str, Any] | None:
        """The next frame, or None at the end of the stream."""
        while True:
            if len(self.buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self.buffer)
                if size > _MAX_FRAME:
                    raise ValueError(f"a frame of {size} bytes")
                if len(self.buffer) >= _HEADER.size + size:
                    data = self.buffer[_HEADER.size:_HEADER.size + size]
                    self.buffer = self.buffer[_HEADER.size + size:]
                    message = json.loads(data)
                    if not isinstance(message, dict):
                        raise ValueError("a frame that is not an object")
                    return message
            chunk, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, 3)
            self.fds.extend(fds)
            if not chunk:
                return None
            self.buffer += chunk


def interpreter() -> dict[str, Any]:
    """What a client's interpreter must share with the launcher's: the executable and the options it started with."""
    return {"executable": sys.executable, "flags": list(sys.flags), "warnoptions": list(sys.warnoptions),
            "xoptions": sorted(f"{k}={v}" for k, v in sys._xoptions.items())}


def import_time(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if (k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_TIME_VARIABLES) and k not in RUN_TIME_VARIABLES}
