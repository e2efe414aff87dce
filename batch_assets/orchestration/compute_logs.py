"""The instance's compute-log manager: each step's stdout and stderr kept in files for the UI, and mirrored to the
process's own stdout and stderr by a thread instead of by child processes (start-up).

Dagster's LocalComputeLogManager points the step's file descriptors 1 and 2 at files under
`$DAGSTER_HOME/storage` (the UI's stdout/stderr tabs read them) and mirrors each file back to the terminal with a
`tail -F` child, watched by a Python child that kills the tail if the step's process dies: four processes per step,
each Python one a new interpreter (30 ms of CPU). On this machine's 2 cores that was a tenth of a CLI delta's wall
with nothing due, and it is paid by every step of every run (the multiprocess executor's steps each pay it).

`MirroredComputeLogManager` keeps the same files in the same place, written the same way (the descriptor itself
points at the file, so everything up to a crash is in it, a C library's output included), and mirrors them with a
thread of the step's process: it reads what was appended since the capture began and writes it to a duplicate of
the original descriptor, until the capture ends and it has read the rest. Nothing outlives the process, so nothing
needs watching. The UI, `dagster` commands and the webserver read the files as LocalComputeLogManager's.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from dagster import Field, Float, StringSource
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._serdes import ConfigurableClassData
from dagster._utils import ensure_file, touch_file

MIRROR_POLL_S = (0.05, 0.5)
"""How often the mirror looks for new output while the step writes none: after 0.05 s, doubling up to 0.5 s while
the step stays quiet (a resident worker's step may run for days), back to 0.05 s once it writes. Output already
written is copied at once, a chunk at a time."""
MIRROR_CHUNK = 1 << 16
FINAL_READ_TIMEOUT_S = 5.0
"""At the end of a capture the mirror copies what is left; a terminal that no longer reads is given up after this."""


class MirroredComputeLogManager(LocalComputeLogManager):
    """LocalComputeLogManager whose terminal mirror is a thread (see the module docstring). `base_dir` defaults to
    Dagster's own default, `$DAGSTER_HOME/storage` (without DAGSTER_HOME: under the system's temporary directory)."""

    def __init__(self, base_dir: str | None = None, polling_timeout: float | None = None,
                 inst_data: ConfigurableClassData | None = None) -> None:
        if not base_dir:
            home = os.environ.get("DAGSTER_HOME", "").strip()
            # A run worker that rebuilds the instance from its serialized form may have no DAGSTER_HOME of its own
            # (a Celery worker on another host): its steps' logs stay on its own disk, as with Dagster's default
            # manager there, under the system's temporary directory rather than wherever the worker was started.
            root = Path(home).expanduser().resolve() if home else Path(tempfile.gettempdir()) / "batch_assets_dagster"
            base_dir = str(root / "storage")
        super().__init__(base_dir, polling_timeout=polling_timeout, inst_data=inst_data)

    @classmethod
    def config_type(cls) -> Any:
        return {"base_dir": Field(StringSource, is_required=False),
                "polling_timeout": Field(Float, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> MirroredComputeLogManager:
        return cls(inst_data=inst_data, **dict(config_value))

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext, None, None]:
        if os.name == "nt":  # Dagster's own way there (its console streams are not descriptors to point elsewhere)
            with super().capture_logs(log_key) as context:
                yield context
            return
        outpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        errpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with mirrored(sys.stdout, outpath), mirrored(sys.stderr, errpath):
            yield CapturedLogContext(log_key)
        touch_file(self.complete_artifact_path(log_key))  # the UI's sign that the capture is complete


def _fileno(stream: IO[Any]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # a test runner's stand-in stream has none
        return None


@contextmanager
def mirrored(stream: IO[Any], path: str) -> Iterator[None]:
    """While the block runs, `stream`'s file descriptor writes to the file `path` (appended), and a thread copies
    what is appended to the descriptor's original target. A stream without a descriptor is left alone."""
    ensure_file(path)
    fd = _fileno(stream)
    if fd is None:
        yield
        return
    stream.flush()
    original = os.dup(fd)
    try:
        start = os.path.getsize(path)  # what the file held before this capture is not shown again
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            # Started before the descriptor moves: a failure to start it (no thread left, say) leaves the step
            # writing to the terminal, as a failure to move the descriptor leaves no thread behind.
            mirror = _Mirror(path, start, os.dup(original))
            try:
                os.dup2(target, fd)
            except BaseException:
                mirror.finish()
                raise
        finally:
            os.close(target)
    except BaseException:
        os.close(original)
        raise
    try:
        yield
    finally:
        try:
            stream.flush()
        finally:
            try:
                os.dup2(original, fd)
                os.close(original)
            finally:
                mirror.finish()


class _Mirror:
    """Copies what is appended to a file after `start` to descriptor `out`, in a daemon thread, until `finish`.

    The thread owns both descriptors and closes them when it ends: one left writing to a terminal that stopped
    reading past FINAL_READ_TIMEOUT_S keeps its descriptor, so the number is never reused under it."""

    def __init__(self, path: str, start: int, out: int) -> None:
        self.out = out
        try:
            self.source = os.open(path, os.O_RDONLY)
            try:
                os.lseek(self.source, start, os.SEEK_SET)
                self.done = threading.Event()
                self.thread = threading.Thread(target=self._run, name="batch-assets-log-mirror", daemon=True)
                self.thread.start()
            except BaseException:
                os.close(self.source)
                raise
        except BaseException:
            os.close(out)
            raise

    def _copy_available(self) -> bool:
        """Copy everything readable now; False once the terminal refused a write (the copying stops, the file
        keeps everything)."""
        while chunk := os.read(self.source, MIRROR_CHUNK):
            view = memoryview(chunk)
            while view:
                try:
                    view = view[os.write(self.out, view):]
                except OSError:  # the terminal is gone (EPIPE, EBADF): the file is the record
                    return False
        return True

    def _run(self) -> None:
        first, most = MIRROR_POLL_S
        wait = first
        try:
            while True:
                position = os.lseek(self.source, 0, os.SEEK_CUR)
                if not self._copy_available():
                    break
                wait = first if os.lseek(self.source, 0, os.SEEK_CUR) != position else min(wait * 2, most)
                if self.done.wait(wait):
                    break
            if self.done.is_set():
                self._copy_available()  # what the step wrote just before its capture ended
        except OSError:
            return
        finally:
            os.close(self.source)
            os.close(self.out)

    def finish(self) -> None:
        self.done.set()
        self.thread.join(FINAL_READ_TIMEOUT_S)
