"""Each step's stdout and stderr: in the files the UI reads, and on the process's own streams, without child
processes (orchestration/compute_logs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import dagster as dg
import psutil
import pytest
import yaml

from batch_assets.orchestration.compute_logs import MIRROR_CHUNK, MirroredComputeLogManager, mirrored
from batch_assets.orchestration.instance_home import TEMPLATES, instance_template

MANAGER = {"module": "batch_assets.orchestration.compute_logs", "class": "MirroredComputeLogManager"}


def _helpers() -> list[str]:
    """This process's children that mirror compute logs the way Dagster's default manager does."""
    return [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)
            if p.name() == "tail" or any("watch_orphans" in part for part in p.cmdline())]


@dg.op
def talkative() -> list[str]:
    print("to stdout through Python")
    sys.stdout.flush()
    os.write(2, b"to stderr through the descriptor\n")
    subprocess.run([sys.executable, "-c", "print('from a child process')"], check=True)
    return _helpers()


@dg.job
def talkative_job() -> None:
    talkative()


def test_both_instance_files_name_the_mirrored_manager() -> None:
    """dagster.yaml and dagster.postgres.yaml (what `batch-assets` copies into DAGSTER_HOME) use it."""
    for name in TEMPLATES:
        config = yaml.safe_load(instance_template(name))
        assert config["compute_logs"] == MANAGER, name


def test_a_worker_without_dagster_home_rebuilds_the_manager_from_the_instance_it_was_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Celery worker rebuilds the instance from its serialized form and may have no DAGSTER_HOME of its own: the
    manager is still built (its steps' logs on the worker's own disk, under the temporary directory), where it
    first refused and failed every step the worker ran."""
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import deserialize_value, serialize_value

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"compute_logs": MANAGER}))
    with dg.DagsterInstance.get() as instance:
        sent = serialize_value(instance.get_ref())
    monkeypatch.delenv("DAGSTER_HOME")
    with dg.DagsterInstance.from_ref(deserialize_value(sent, InstanceRef)) as rebuilt:
        manager = rebuilt.compute_log_manager
        assert isinstance(manager, MirroredComputeLogManager)
        assert manager._base_dir == str(Path(tempfile.gettempdir()) / "batch_assets_dagster" / "storage")


def test_a_step_output_reaches_the_ui_files_and_the_terminal_without_helper_processes(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # As in a CLI process, sys.stdout and sys.stderr write to descriptors 1 and 2 (under pytest they write
    # elsewhere), so a child process's inherited descriptors are captured too.
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))
    overrides = {"compute_logs": {**MANAGER, "config": {"base_dir": str(tmp_path)}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        assert isinstance(instance.compute_log_manager, MirroredComputeLogManager)
        result = talkative_job.execute_in_process(instance=instance)
        assert result.success
        assert result.output_for_node("talkative") == []  # no tail, no watcher while the step ran
        [out_file] = (tmp_path / result.run_id / "compute_logs").glob("*.out")
        log_key = [result.run_id, "compute_logs", out_file.stem]
        data = instance.compute_log_manager.get_log_data(log_key)
        assert instance.compute_log_manager.is_capture_complete(log_key)
    out, err = capfd.readouterr()
    stored_out, stored_err = (data.stdout or b"").decode(), (data.stderr or b"").decode()
    for text in ("to stdout through Python", "from a child process"):
        assert text in stored_out and text in out, (text, stored_out, out)
    assert "to stderr through the descriptor" in stored_err and "to stderr through the descriptor" in err


def test_the_mirror_copies_everything_written_and_restores_the_descriptor(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """More than three chunks written at once all arrive, in order; a second capture into the same file shows only
    its own output; the descriptor points back at the terminal after, and no mirror thread or descriptor is left."""
    threads, fds = _mirror_threads(), _open_fds()
    path = str(tmp_path / "step.out")
    fd1 = open(1, "w", closefd=False)  # the descriptor itself (pytest's sys.stdout writes elsewhere)
    big = "".join(f"line {i:06d}\n" for i in range(3 * MIRROR_CHUNK // 12))
    with mirrored(fd1, path):
        os.write(1, big.encode())
    with mirrored(fd1, path):
        os.write(1, b"second capture\n")
    os.write(1, b"after the capture\n")
    out, _ = capfd.readouterr()
    assert out == big + "second capture\n" + "after the capture\n"
    assert Path(path).read_text() == big + "second capture\n"
    assert (_mirror_threads(), _open_fds()) == (threads, fds)


def test_a_terminal_that_is_gone_stops_the_mirror_not_the_step(tmp_path: Path) -> None:
    """With the original stdout a pipe nobody reads any more, the step's writes still land in the file, and the
    mirror ends (its thread and descriptors gone) instead of writing on."""
    threads, fds = _mirror_threads(), _open_fds()
    read_end, write_end = os.pipe()
    os.close(read_end)
    saved = os.dup(1)
    try:
        os.dup2(write_end, 1)
        path = str(tmp_path / "gone.out")
        with mirrored(open(1, "w", closefd=False), path):
            os.write(1, b"kept in the file\n")
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(write_end)
    assert Path(path).read_text() == "kept in the file\n"
    assert (_mirror_threads(), _open_fds()) == (threads, fds)


def test_a_failure_to_start_the_mirror_leaves_the_descriptor_on_the_terminal(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread to be had (a container's process limit): the capture fails, the step's descriptor is not left
    pointing at the file and nothing leaks."""
    fds = _open_fds()

    def refuse(_self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError), mirrored(open(1, "w", closefd=False), str(tmp_path / "no.out")):
        pass
    monkeypatch.undo()
    os.write(1, b"still on the terminal\n")
    assert capfd.readouterr().out == "still on the terminal\n"
    assert (tmp_path / "no.out").read_text() == "" and _open_fds() == fds


def test_an_exception_in_the_step_ends_the_capture_cleanly(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    threads, fds = _mirror_threads(), _open_fds()
    with pytest.raises(ValueError), mirrored(open(1, "w", closefd=False), str(tmp_path / "raised.out")):
        os.write(1, b"before the error\n")
        raise ValueError("the step failed")
    assert capfd.readouterr().out == "before the error\n"
    assert (_mirror_threads(), _open_fds()) == (threads, fds)


def _mirror_threads() -> int:
    return sum(t.name == "batch-assets-log-mirror" for t in threading.enumerate())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
