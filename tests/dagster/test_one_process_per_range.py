"""The sweep jobs' executor (orchestration.executors): a run of one range never starts a step subprocess.

A job shaped like a sweep (plan → mapped range steps → summary) records the pid of every step; the run
executes on a real instance with the executor's default config (multiprocess), as a schedule or the UI
launches it.
"""

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.definitions.reconstruct import ReconstructableJob

from batch_assets.orchestration.executors import in_one_process, ranges_executor


def ranges_of(op_config: Mapping[str, Any]) -> int:
    return 1 if op_config.get("mode", "delta") == "delta" else int(op_config.get("ranges", 4))


def _record(path: str, step: str) -> None:
    with open(path, "a") as out:
        out.write(f"{step} {os.getpid()}\n")


@dg.op(config_schema={"mode": str, "ranges": int, "pids": str}, out=dg.DynamicOut(str))
def plan(context: dg.OpExecutionContext) -> Iterator[dg.DynamicOutput[str]]:
    _record(context.op_config["pids"], "plan")
    for i in range(ranges_of(context.op_config)):
        yield dg.DynamicOutput(context.op_config["pids"], mapping_key=f"r{i}")


@dg.op
def sweep_range(pids: str) -> str:
    _record(pids, "range")
    return pids


@dg.op
def summary(results: list[str]) -> None:
    _record(results[0], "summary")


@dg.job(executor_def=ranges_executor("plan", ranges_of))
def shaped_like_a_sweep() -> None:
    summary(plan().map(sweep_range).collect())


def _run(tmp_path: Path, run_config_ops: dict[str, Any], execution: dict[str, Any] | None = None) -> dict[str, set]:
    pids = tmp_path / "pids.txt"
    run_config: dict[str, Any] = {"ops": {"plan": {"config": {**run_config_ops, "pids": str(pids)}}}}
    if execution is not None:
        run_config["execution"] = {"config": execution}
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        # By file, not module: the step subprocesses do not have pytest's sys.path entry for this folder.
        recon = ReconstructableJob.for_file(__file__, "shaped_like_a_sweep")
        result = dg.execute_job(recon, instance=instance, run_config=run_config)
        assert result.success
    by_step: dict[str, set] = {}
    for line in pids.read_text().splitlines():
        step, pid = line.split()
        by_step.setdefault(step, set()).add(int(pid))
    return by_step


def test_a_delta_runs_every_step_in_the_run_worker(tmp_path: Path) -> None:
    steps = _run(tmp_path, {"mode": "delta", "ranges": 4})
    assert steps["plan"] == steps["range"] == steps["summary"] == {os.getpid()}


def test_a_full_run_of_one_range_runs_in_one_process(tmp_path: Path) -> None:
    steps = _run(tmp_path, {"mode": "full", "ranges": 1})
    assert steps["plan"] | steps["range"] | steps["summary"] == {os.getpid()}


def test_several_ranges_get_a_process_per_step(tmp_path: Path) -> None:
    steps = _run(tmp_path, {"mode": "full", "ranges": 2})
    assert len(steps["range"]) == 2
    assert os.getpid() not in steps["plan"] | steps["range"] | steps["summary"]


def test_in_process_config_still_forces_one_process(tmp_path: Path) -> None:
    steps = _run(tmp_path, {"mode": "full", "ranges": 2}, execution={"in_process": {}})
    assert steps["plan"] | steps["range"] | steps["summary"] == {os.getpid()}


@pytest.mark.parametrize(
    ("run_config", "expected"),
    [
        ({"ops": {"plan": {"config": {"mode": "delta"}}}}, True),
        ({"ops": {"plan": {"config": {"mode": "full", "ranges": 3}}}}, False),
        ({"ops": {"plan": {"config": {"mode": "full", "ranges": "x"}}}}, False),
        ({"ops": {"plan": {"config": {"mode": "full", "ranges": 3}}},
          "execution": {"config": {"in_process": {}}}}, True),
        (None, True),
    ],
)
def test_in_one_process_reads_the_runs_own_config(run_config: Any, expected: bool) -> None:
    assert in_one_process(run_config, "plan", ranges_of) is expected


def test_a_graph_backed_assets_plan_op_is_found_under_its_node() -> None:
    nested = {"ops": {"sweep": {"ops": {"plan": {"config": {"mode": "delta"}}}}}}
    assert in_one_process(nested, "sweep.plan", ranges_of)
    assert not in_one_process({"ops": {"sweep": {"ops": {"plan": {"config": {"mode": "full"}}}}}}, "sweep.plan",
                              ranges_of)
