"""A step waiting for a pool slot leaves the in-process executor asleep (orchestration.executors,
`sleep_while_a_step_waits_for_a_slot`), instead of spinning a core until the slot is free."""

import uuid

import dagster as dg
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

from batch_assets.orchestration.executors import PATCHED_DAGSTER

POOL = "test_pool"


def test_the_pinned_dagster_is_the_one_mended() -> None:
    """The mend applies to the dagster the project pins; an upgrade fails here until the busy wait is looked at."""
    assert dg.__version__ == PATCHED_DAGSTER


def test_a_pending_claim_sleeps_until_its_next_check() -> None:
    """With the pool's one slot held by another run, a step's claim is pending: the executor's interval is the time
    left until Dagster's next check of that claim (about 1 s after the first refusal), not 0 (a busy loop)."""
    with dg.instance_for_test() as instance:
        storage = instance.event_log_storage
        assert storage.supports_global_concurrency_limits
        storage.set_concurrency_slots(POOL, 1)
        assert storage.claim_concurrency_slot(POOL, "holder-run", "holder_step").is_claimed
        run = dg.DagsterRun(job_name="waiting_job", run_id=str(uuid.uuid4()))
        with InstanceConcurrencyContext(instance, run) as context:
            assert context.interval_to_next_pending_claim_check() == 0.0  # nothing pending yet
            assert context.claim(POOL, "waiting_step") is False
            assert context.has_pending_claims()
            first = context.interval_to_next_pending_claim_check()
            assert 0.5 < first <= 15.0, first
            assert context.claim(POOL, "waiting_step") is False  # before its time: refused without a check
            assert 0.0 < context.interval_to_next_pending_claim_check() <= first
            storage.free_concurrency_slot_for_step("holder-run", "holder_step")
        assert not storage.get_concurrency_info(POOL).active_run_ids
