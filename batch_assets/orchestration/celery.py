"""The celery executor of the sweep, which refuses to wait for a worker forever.

dagster-celery submits each step to the broker and polls for its result: with no worker on the
queue, a run stays STARTED for ever and its run process keeps polling. Here the run first waits
at most `worker_wait_s` for a worker that consumes the queue; without one it fails with a message
that says so, before submitting anything, and its process exits.

A step whose worker is lost while it runs (its host killed or cut off) would likewise never return a
result: here the run process asks the workers which of its tasks they hold (`inspect().query_task`,
every `WORKER_CHECK_S`), and a task last seen on a worker that has not reported it for `worker_lost_s`
is failed with a message naming its step (the range) and that worker. The run then ends FAILURE once the
steps still running elsewhere are done; the lost range resumes from its checkpoint in the next run. The
lost step itself is never judged dead: it may still run on a host cut off from the broker, so the run is
tagged `LOST_WORKER_TAG` and its launcher leaves the run's lease and lock to expire (60 s / 120 s after
their last renewal) instead of giving them back; meanwhile every write of the lost step is fenced on them.

The broker is Redis (broker and result backend) or RabbitMQ (`amqp://`, results over `rpc://`).

dagster-celery comes with the `celery` extra and is imported only when a run on this executor starts: a job that
names the executor loads without it (its executor config is then not checked field by field), and a run on it
stops with one line naming the extra.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dagster as dg

from batch_assets.extras import installed, needs_extra

CELERY_BROKER_VAR = "BATCH_ASSETS_CELERY_BROKER_URL"
DEFAULT_CELERY_BROKER = "redis://127.0.0.1:6379/0"
DEFAULT_WORKER_WAIT_S = 30.0
MAX_WORKER_WAIT_S = 3600.0
CELERY_QUEUE = "dagster"
DEFAULT_WORKER_LOST_S = 30.0
WORKER_CHECK_S = 5.0
"""How often the run process asks the workers which of its tasks they hold."""
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
LOST_WORKER_TAG = "batch_assets/lost_celery_worker"
"""On a run one of whose steps lost its worker: that worker. The launcher then leaves lease and lock to expire."""


def result_backend_for(broker: str) -> str:
    """The result backend that goes with a broker: Redis is both; RabbitMQ sends results back over `rpc://`."""
    return "rpc://" if broker.split(":", 1)[0].lower() in AMQP_SCHEMES else broker


def celery_broker_url() -> str:
    """BATCH_ASSETS_CELERY_BROKER_URL, else the local Redis (read when a run starts, not at import)."""
    return os.environ.get(CELERY_BROKER_VAR, "").strip() or DEFAULT_CELERY_BROKER


class NoCeleryWorker(Exception):
    """No celery worker consumed the queue within worker_wait_s."""


def wait_for_worker(app: Any, queue: str, wait_s: float) -> str:
    """The name of a worker consuming `queue`, polling the broker for at most `wait_s`; NoCeleryWorker otherwise."""
    deadline = time.monotonic() + wait_s
    while True:
        replies = app.control.inspect(timeout=1.0).active_queues() or {}
        for worker, queues in replies.items():
            if any(q.get("name") == queue for q in queues or ()):
                return worker
        if time.monotonic() >= deadline:
            raise NoCeleryWorker(
                f"no celery worker consumed queue {queue!r} within {wait_s:g}s (worker_wait_s); start one "
                f"(`celery -A dagster_celery.app worker -Q {queue}`, see README) or run the sweep on "
                "customer_status_sweep_job"
            )
        time.sleep(0.5)  # the broker's poll interval while waiting for a worker


class CeleryWorkerLost(Exception):
    """The worker that held a step's task stopped reporting it before its result arrived."""


class WorkerWatch:
    """Which worker holds each submitted task, from the workers' own replies; finds tasks whose worker is lost."""

    def __init__(self, app: Any, lost_after_s: float, log: Any, on_lost: Any = None) -> None:
        self.app = app
        self.lost_after_s = lost_after_s
        self.log = log
        self.on_lost = on_lost
        """Called with the worker's name when one of its tasks is found lost."""
        self.step_of: dict[str, str] = {}
        self.seen: dict[str, tuple[str, float]] = {}
        """task id -> (worker, monotonic time it last reported the task)"""
        self.lost: dict[str, str] = {}
        self._checked = 0.0

    def watch(self, task_id: str, step_key: str) -> None:
        self.step_of[task_id] = step_key

    def forget(self, task_id: str) -> None:
        self.step_of.pop(task_id, None)
        self.seen.pop(task_id, None)

    def check(self) -> None:
        """At most every WORKER_CHECK_S: ask the workers for the pending tasks; mark lost the ones nobody reports."""
        now = time.monotonic()
        if now - self._checked < WORKER_CHECK_S or not self.step_of:
            return
        self._checked = now
        pending = [t for t in self.step_of if t not in self.lost]
        try:
            replies = self.app.control.inspect(timeout=1.0).query_task(*pending) or {}
        except Exception as exc:  # the broker is unreachable: nothing can be judged this round
            self.log.warning(f"celery workers could not be asked for their tasks: {type(exc).__name__}: {exc}")
            return
        now = time.monotonic()
        for worker, tasks in replies.items():
            for task_id in tasks or {}:
                if task_id in self.step_of:
                    self.seen[task_id] = (worker, now)
        for task_id in pending:
            if task_id not in self.seen:
                continue  # still queued in the broker (or not yet picked up): it waits for a worker
            worker, last = self.seen[task_id]
            if now - last > self.lost_after_s:
                self.lost[task_id] = (
                    f"celery worker {worker} stopped reporting step {self.step_of[task_id]} "
                    f"{now - last:.0f}s ago (worker_lost_s {self.lost_after_s:g}) before its result arrived: the "
                    "worker or its host is gone or cut off; the step's range resumes from its checkpoint in the "
                    "next run"
                )
                self.log.error(self.lost[task_id])
                if self.on_lost is not None:
                    self.on_lost(worker)


class WatchedResult:
    """A step's AsyncResult that is also ready, with CeleryWorkerLost, once its worker is lost."""

    def __init__(self, inner: Any, watch: WorkerWatch, step_key: str) -> None:
        self.inner = inner
        self.watch = watch
        watch.watch(inner.id, step_key)

    def ready(self) -> bool:
        if self.inner.ready():
            self.watch.forget(self.inner.id)
            return True
        self.watch.check()
        return self.inner.id in self.watch.lost

    def get(self) -> Any:
        if self.inner.id in self.watch.lost and not self.inner.ready():
            raise CeleryWorkerLost(self.watch.lost[self.inner.id])
        return self.inner.get()

    def revoke(self) -> None:
        self.inner.revoke()


class WorkerWaitingCeleryExecutor(dg.Executor):
    """dagster-celery's CeleryExecutor that fails the run when no worker shows up within worker_wait_s, and fails a
    step whose worker is lost (silent for worker_lost_s) instead of waiting for its result for ever.

    It wraps the library's executor (built by the library from the same config: retries, include, config_source)
    instead of subclassing it, so that this module imports dagster-celery only when a run starts."""

    def __init__(self, celery: Any, *, worker_wait_s: float, worker_lost_s: float = DEFAULT_WORKER_LOST_S) -> None:
        self.celery = celery
        self.worker_wait_s = worker_wait_s
        self.worker_lost_s = worker_lost_s

    @property
    def retries(self) -> Any:
        return self.celery.retries

    def app_args(self) -> Any:
        """The celery app's arguments (dagster-celery's execution loop builds its app from them)."""
        return self.celery.app_args()

    def execute(self, plan_context: Any, execution_plan: Any) -> Any:
        from dagster_celery.core_execution_loop import core_celery_execution_loop
        from dagster_celery.executor import _submit_task
        from dagster_celery.make_app import make_app

        app = make_app(self.app_args())
        try:
            worker = wait_for_worker(app, CELERY_QUEUE, self.worker_wait_s)
            plan_context.log.info(f"celery worker {worker} consumes queue {CELERY_QUEUE!r}; submitting steps")
            run_id = plan_context.dagster_run.run_id
            watch = WorkerWatch(app, self.worker_lost_s, plan_context.log, on_lost=lambda worker: (
                plan_context.instance.add_run_tags(run_id, {LOST_WORKER_TAG: worker})))

            def submit(app_: Any, context: Any, step: Any, queue: str, priority: int, known_state: Any) -> Any:
                return WatchedResult(_submit_task(app_, context, step, queue, priority, known_state), watch, step.key)

            yield from core_celery_execution_loop(plan_context, execution_plan, step_execution_fn=submit)
        finally:
            app.close()


def _config_schema() -> Any:
    """dagster-celery's executor config (but its broker and backend) with ours; without the library, any config
    (the run then stops on the missing extra before it reads any)."""
    own = {
        "broker": dg.Field(
            str, is_required=False,
            description=f"URL of the celery broker: redis:// (also the result backend) or amqp:// (RabbitMQ, results "
            f"over rpc://); default {CELERY_BROKER_VAR} or {DEFAULT_CELERY_BROKER}.",
        ),
        "worker_lost_s": dg.Field(
            float, is_required=False, default_value=DEFAULT_WORKER_LOST_S,
            description="Fail a step whose worker has not reported it for this many seconds (its host is lost); "
            f"at most {MAX_WORKER_WAIT_S:g}.",
        ),
        "worker_wait_s": dg.Field(
            float, is_required=False, default_value=DEFAULT_WORKER_WAIT_S,
            description=f"Fail the run when no celery worker consumes the queue within this many seconds "
            f"(at most {MAX_WORKER_WAIT_S:g}).",
        ),
    }
    if not installed("dagster_celery"):
        return dg.Permissive(own)
    from dagster_celery.executor import CELERY_CONFIG

    return {**{k: v for k, v in CELERY_CONFIG.items() if k not in ("broker", "backend")}, **own}


@dg.executor(
    name="celery",
    config_schema=_config_schema(),
    requirements=dg.multiple_process_executor_requirements(),
)
def celery_on_redis_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
    """dagster-celery's executor on Redis or RabbitMQ, failing fast without a worker and on a lost worker."""
    config = init_context.executor_config
    wait_s = float(str(config.get("worker_wait_s", DEFAULT_WORKER_WAIT_S)))
    lost_s = float(str(config.get("worker_lost_s", DEFAULT_WORKER_LOST_S)))
    for name, value in (("worker_wait_s", wait_s), ("worker_lost_s", lost_s)):
        if not 0 < value <= MAX_WORKER_WAIT_S:
            raise dg.DagsterInvalidConfigError(
                f"{name} must be in (0, {MAX_WORKER_WAIT_S:g}], got {value}", [], config
            )
    with needs_extra():
        from dagster_celery.executor import CeleryExecutor, celery_executor
    create = celery_executor.executor_creation_fn
    if create is None:  # dagster-celery always defines it; a release that did not would be a packaging error
        raise dg.DagsterInvariantViolationError("dagster_celery.celery_executor has no creation function")
    base = create(init_context)  # the library's retries, include and config_source
    if not isinstance(base, CeleryExecutor):
        raise dg.DagsterInvariantViolationError(f"expected a CeleryExecutor, got {type(base).__name__}")
    broker = str(config.get("broker") or celery_broker_url())
    celery = CeleryExecutor(retries=base.retries, broker=broker, backend=result_backend_for(broker),
                            include=base.include, config_source=dict(vars(base.config_source)))
    return WorkerWaitingCeleryExecutor(celery, worker_wait_s=wait_s, worker_lost_s=lost_s)
