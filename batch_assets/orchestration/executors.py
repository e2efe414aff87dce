"""The sweep jobs' executor: one process when the run has one range, a process per range otherwise.

Dagster's default executor (`multi_or_in_process_executor`) starts a subprocess for every step when it runs
multiprocess. A delta, or a full run of one range, is three steps (plan → range → summary) that each pay the
code location's import again (about 2 s apiece) for work that may take 70 ms. So a sweep job carries this
executor instead:

- its config is the default executor's (`execution: config: multiprocess | in_process`), so every run config
  that worked before still works, and `in_process` still forces one process;
- with `multiprocess` (the default), the choice is made when the run starts, from the run's own op config:
  a run of one range executes in-process, in the run worker; a run of several ranges gets one process per
  step, at most `max_concurrent` at a time, exactly as before.

How many ranges a run has is the job's own rule (`ranges_of`, e.g. "a delta is one range"); the same rule
tells the ops whether they share one process (`in_one_process`), for the lock owner's identity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import dagster as dg

RangesOf = Callable[[Mapping[str, Any]], int]
"""How many cursor ranges a run of the job has, from its plan op's config (a mapping of the op's fields)."""


def plan_op_config(run_config: Mapping[str, Any] | None, plan_op: str) -> Mapping[str, Any]:
    """The config of the job's plan op in a run config (empty when the run config has none).

    `plan_op` is the op's name, or a dotted path for an op inside a graph: a graph-backed asset's plan op
    `customer_status_sweep.plan_sweep` is configured at `ops.customer_status_sweep.ops.plan_sweep.config`.
    """
    node: Mapping[str, Any] = run_config or {}
    for name in plan_op.split("."):
        node = ((node.get("ops") or {}).get(name)) or {}
    return node.get("config") or {}


def in_one_process(run_config: Mapping[str, Any] | None, plan_op: str, ranges_of: RangesOf) -> bool:
    """Whether every step of the run executes in the run worker's own process with this executor."""
    execution = ((run_config or {}).get("execution") or {}).get("config") or {}
    if "in_process" in execution:
        return True
    try:
        return ranges_of(plan_op_config(run_config, plan_op)) <= 1
    except (TypeError, ValueError):
        # A malformed value is the plan op's to report (one line naming the field); the run keeps the
        # default multiprocess layout and that op fails as it would without this executor.
        return False


class OneProcessPerRange(dg.Executor):
    """The multiprocess executor, except for a run of one range, which executes in-process."""

    def __init__(self, multiprocess: dg.Executor, plan_op: str, ranges_of: RangesOf) -> None:
        self._multiprocess = multiprocess
        self._plan_op = plan_op
        self._ranges_of = ranges_of

    @property
    def retries(self) -> Any:
        return self._multiprocess.retries

    @property
    def step_dependency_config(self) -> Any:
        return self._multiprocess.step_dependency_config

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[Any]:
        if in_one_process(plan_context.dagster_run.run_config, self._plan_op, self._ranges_of):
            from dagster._core.executor.in_process import InProcessExecutor

            executor: dg.Executor = InProcessExecutor(
                retries=self.retries, step_dependency_config=self.step_dependency_config
            )
        else:
            executor = self._multiprocess
        return executor.execute(plan_context, execution_plan)


def ranges_executor(plan_op: str, ranges_of: RangesOf) -> dg.ExecutorDefinition:
    """The executor of a job mapped over cursor ranges: see the module docstring."""
    # The default executor's creation functions and requirements: the same config, validated the same way.
    from dagster._core.definitions.executor_definition import (
        _core_in_process_executor_creation,
        _core_multiprocess_executor_creation,
        _get_default_executor_requirements,
        multi_or_in_process_executor,
    )

    def create(init_context: dg.InitExecutorContext) -> dg.Executor:
        config = cast(Mapping[str, Mapping[str, object]], init_context.executor_config)
        if "multiprocess" not in config:
            return _core_in_process_executor_creation(config["in_process"])
        multiprocess = _core_multiprocess_executor_creation(config["multiprocess"])
        return OneProcessPerRange(multiprocess, plan_op, ranges_of)

    return dg.ExecutorDefinition(
        name="ranges_executor",
        config_schema=multi_or_in_process_executor.config_schema.as_field(),
        requirements=_get_default_executor_requirements,
        executor_creation_fn=create,
        description="One process for a run of one range; one process per step (at most max_concurrent) "
                    "otherwise. execution: config: in_process forces one process.",
    )


def sleep_while_a_step_waits_for_a_slot() -> None:
    """Make Dagster's in-process executor sleep, instead of spinning, while a step waits for a pool slot.

    A step over its pool's limit is retried at intervals Dagster sets itself (1 s, growing to 15 s), and the
    in-process executor sleeps `ActiveExecution.sleep_interval()` between its checks. In Dagster 1.13 that interval
    comes from `InstanceConcurrencyContext.interval_to_next_pending_claim_check`, which returns
    `min([0, *time_left])`: never more than 0. So the executor never sleeps, and a CLI run whose step waits for a
    slot of `batch_assets_app_db` spins a whole core for as long as it waits, on the machine whose cores the run
    holding the slot needs (an upstream fix, dagster-io/dagster#20367, was closed unmerged). Here the interval is the
    time left until the earliest pending check, never below 0; when a claim is checked, and so how soon a step gets
    a slot that was freed, is unchanged (`claim()` still decides that from the same timeouts). The multiprocess
    executor does not use this interval. Applied once per process when this module is imported (below): every
    process that loads the code location or runs a job imports it, and a command that does neither (`--help`, a
    refused argument) does not import dagster for it; a dagster other than the pinned one keeps its own method, and
    tests/dagster/test_executors_slot_wait.py fails until this is looked at again.
    """
    from dagster._core.execution.plan import instance_concurrency_context as module

    context = module.InstanceConcurrencyContext
    mended = getattr(context.interval_to_next_pending_claim_check, "batch_assets", False)
    if dg.__version__ != PATCHED_DAGSTER or mended:
        return

    def interval_to_next_pending_claim_check(self: Any) -> float:
        timeouts = self._pending_timeouts
        if not self._pending_claims or not timeouts:
            return 0.0
        return max(0.0, min(timeouts.values()) - module.time.time())

    interval_to_next_pending_claim_check.batch_assets = True  # type: ignore[attr-defined]
    context.interval_to_next_pending_claim_check = interval_to_next_pending_claim_check  # type: ignore[method-assign]


PATCHED_DAGSTER = "1.13.27"
"""The dagster release whose busy wait `sleep_while_a_step_waits_for_a_slot` mends (pyproject pins it)."""


# Every process that imports the executors (the code location, a run worker, a CLI run) gets the mend.
sleep_while_a_step_waits_for_a_slot()
