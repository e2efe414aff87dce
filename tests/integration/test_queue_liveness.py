"""Liveness, not only the lease: the claim renewal on a real PostgreSQL, fenced by the claim token."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from batch_assets.queue.liveness import ClaimRenewer, Holdings, Liveness
from batch_assets.queue.side import SideConnection
from batch_assets.reference.payments.queue import enqueue
from batch_assets.reference.payments.store import PAYMENTS

pytestmark = pytest.mark.integration


def _conninfo(db_url: str) -> str:
    return sa.engine.make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _with_side(db_url: str, body: Any) -> Any:
    side = SideConnection(_conninfo(db_url))
    try:
        return await body(side)
    finally:
        await side.aclose()


def _claim(engine: sa.Engine, n: int, lease_s: float) -> list[Any]:
    return PAYMENTS.claim(engine, n, lease_s)


def _leases(engine: sa.Engine) -> dict[uuid.UUID, Any]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, claimed_until - now() FROM payments WHERE status = 'PROCESSING'"))
        return {r[0]: r[1] for r in rows}


def test_renewal_extends_held_claims_and_never_revives_another_owners_row(db_url: str, engine: sa.Engine) -> None:
    """Held claims get claimed_until = now() + lease; a row finished meanwhile, or claimed again under another
    token, is not touched (fenced by the claim token)."""
    enqueue(engine, 5, seed=1)
    claims = _claim(engine, 5, lease_s=2)
    holdings = Holdings()
    holdings.hold(claims)
    finished, stolen = claims[0], claims[1]
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE payments SET status = 'DONE', claimed_until = NULL WHERE id = :id"),
                     {"id": finished.id})
        conn.execute(sa.text("UPDATE payments SET claim_token = gen_random_uuid(), claimed_until = now() + "
                             "interval '5 seconds' WHERE id = :id"), {"id": stolen.id})

    async def scenario(side: SideConnection) -> Liveness:
        liveness = Liveness(600, ClaimRenewer(side, PAYMENTS.sql.renew, holdings))
        await liveness.beat()
        return liveness

    liveness = asyncio.run(_with_side(db_url, scenario))
    assert liveness.stats.renewed == 3 and liveness.stats.not_held == 2
    leases = _leases(engine)
    assert finished.id not in leases
    assert leases[stolen.id].total_seconds() < 10  # the other owner's lease, untouched
    for claim in claims[2:]:
        assert leases[claim.id].total_seconds() > 590


def test_liveness_keeps_a_short_lease_alive_and_stops_when_dropped(db_url: str, engine: sa.Engine) -> None:
    """With a 1 s lease renewed every 1/3 s a held claim never lapses over 3 s; dropped, it lapses within the lease."""
    enqueue(engine, 2, seed=2)
    claims = _claim(engine, 2, lease_s=1)
    holdings = Holdings()
    holdings.hold(claims)

    async def scenario(side: SideConnection) -> tuple[list[bool], bool]:
        liveness = Liveness(1.0, ClaimRenewer(side, PAYMENTS.sql.renew, holdings))
        task = asyncio.create_task(liveness.run())
        seen: list[bool] = []
        try:
            for _ in range(12):
                await asyncio.sleep(0.25)
                leases = await asyncio.to_thread(_leases, engine)
                seen.append(all(v.total_seconds() > 0 for v in leases.values()))
            holdings.drop(claims[:1])
            await asyncio.sleep(1.5)
            lapsed = await asyncio.to_thread(lambda: _leases(engine)[claims[0].id].total_seconds() < 0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return seen, lapsed

    seen, lapsed = asyncio.run(_with_side(db_url, scenario))
    assert all(seen), seen
    assert lapsed
