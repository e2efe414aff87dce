"""The celery executor of the sweep, which refuses to wait for a worker forever.

dagster-celery submits each step to the broker and polls for its result: with no worker on the
queue, a run stays STARTED for ever and its run process keeps polling. Here the run first waits
at most `worker_wait_s` for a worker that consumes the queue; without one it fails with a message
that says so, before submitting anything, and its process exits.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dagster as dg
from dagster_celery import celery_executor
from dagster_celery.executor import CELERY_CONFIG, CeleryExecutor

CELERY_BROKER_VAR = "BATCH_ASSETS_CELERY_BROKER_URL"
DEFAULT_CELERY_BROKER = "redis://127.0.0.1:6379/0"
DEFAULT_WORKER_WAIT_S = 30.0
MAX_WORKER_WAIT_S = 3600.0
CELERY_QUEUE = "dagster"


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


class WorkerWaitingCeleryExecutor(CeleryExecutor):
    """CeleryExecutor that fails the run when no worker shows up within worker_wait_s."""

    def __init__(self, *, worker_wait_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.worker_wait_s = worker_wait_s

    def execute(self, plan_context: Any, execution_plan: Any) -> Any:
        from dagster_celery.make_app import make_app

        app = make_app(self.app_args())
        try:
            worker = wait_for_worker(app, CELERY_QUEUE, self.worker_wait_s)
        finally:
            app.close()
        plan_context.log.info(f"celery worker {worker} consumes queue {CELERY_QUEUE!r}; submitting steps")
        yield from super().execute(plan_context, execution_plan)


@dg.executor(
    name="celery",
    config_schema={
        **{k: v for k, v in CELERY_CONFIG.items() if k not in ("broker", "backend")},
        "broker": dg.Field(
            str, is_required=False,
            description=f"Redis URL of the celery broker and result backend (default {CELERY_BROKER_VAR} or "
            f"{DEFAULT_CELERY_BROKER}).",
        ),
        "worker_wait_s": dg.Field(
            float, is_required=False, default_value=DEFAULT_WORKER_WAIT_S,
            description=f"Fail the run when no celery worker consumes the queue within this many seconds "
            f"(at most {MAX_WORKER_WAIT_S:g}).",
        ),
    },
    requirements=dg.multiple_process_executor_requirements(),
)
def celery_on_redis_executor(init_context: dg.InitExecutorContext) -> CeleryExecutor:
    """dagster-celery's executor on Redis (broker = result backend), failing fast without a worker."""
    config = init_context.executor_config
    wait_s = float(str(config.get("worker_wait_s", DEFAULT_WORKER_WAIT_S)))
    if not 0 < wait_s <= MAX_WORKER_WAIT_S:
        raise dg.DagsterInvalidConfigError(
            f"worker_wait_s must be in (0, {MAX_WORKER_WAIT_S:g}], got {wait_s}", [], config
        )
    create = celery_executor.executor_creation_fn
    if create is None:  # dagster-celery always defines it; a release that did not would be a packaging error
        raise dg.DagsterInvariantViolationError("dagster_celery.celery_executor has no creation function")
    base = create(init_context)  # the library's retries, include and config_source
    if not isinstance(base, CeleryExecutor):
        raise dg.DagsterInvariantViolationError(f"expected a CeleryExecutor, got {type(base).__name__}")
    broker = str(config.get("broker") or celery_broker_url())
    return WorkerWaitingCeleryExecutor(
        worker_wait_s=wait_s, retries=base.retries, broker=broker, backend=broker, include=base.include,
        config_source=dict(vars(base.config_source)),
    )
