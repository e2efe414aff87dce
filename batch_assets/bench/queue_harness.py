"""What the queue bench's parts share: its own rows in the payments table and worker processes released together.

The rows carry ids with a random 64-bit prefix, inserted with COPY and deleted by id range, so the bench deletes
exactly what it inserted; each insert ends with a CHECKPOINT when the role may run one (`settle`, see
bench/payments.py for why).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import psycopg

# What a bench process puts on its queue: the monotonic time it ended, or "<error type>: <text>".
EndReport = float | str

WORKER_PROCESSES = 2

# BENCH_ROWS_STATE — status counts and the largest attempts among the bench's rows.
#   %(lo)s, %(hi)s  uuid  the bench's id range
BENCH_ROWS_STATE = """
SELECT count(*) FILTER (WHERE status = 'DONE'), count(*), coalesce(max(attempts), 0)
  FROM payments WHERE id BETWEEN %(lo)s AND %(hi)s
"""


def conninfo_of(database_url: str) -> str:
    """A libpq conninfo (psycopg's) of a database URL in any of SQLAlchemy's forms."""
    from sqlalchemy.engine import make_url  # here: a spawned floor process never imports SQLAlchemy

    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def settle(conninfo: str) -> bool:
    """A CHECKPOINT before a timed drain, when the role may run one (a superuser or a member of pg_checkpoint);
    False, and nothing done, when it may not."""
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def bench_rows(database_url: str) -> BenchRows:
    """The bench's rows on `database_url` (any URL form): what the floor and the product drain, for a probe that
    must drain the same rows (bench/startup.py's CLI queue probe)."""
    return BenchRows(conninfo_of(database_url))


class BenchRows:
    """The bench's rows: ids `prefix‖counter`, inserted with COPY, deleted by id range."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.prefix = secrets.randbits(63) | 1
        self.lo = uuid.UUID(int=self.prefix << 64)
        self.hi = uuid.UUID(int=(self.prefix << 64) | (2**64 - 1))
        self.next = 0
        self.settled = False  # whether the last insert ended with a CHECKPOINT (settle)

    def insert(self, count: int) -> None:
        with psycopg.connect(self.conninfo) as conn:
            with conn.cursor() as cur, cur.copy("COPY payments (id, amount_cents) FROM STDIN") as copy:
                for _ in range(count):
                    self.next += 1
                    copy.write_row((uuid.UUID(int=(self.prefix << 64) | self.next), 100))
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("ANALYZE payments")
        self.settled = settle(self.conninfo)

    def insert_one(self, conn: psycopg.Connection) -> uuid.UUID:
        self.next += 1
        pid = uuid.UUID(int=(self.prefix << 64) | self.next)
        conn.execute("INSERT INTO payments (id, amount_cents) VALUES (%(id)s, 100)", {"id": pid})
        return pid

    def state(self) -> tuple[int, int, int]:
        """(DONE rows, all rows, max attempts) of the bench's rows."""
        with psycopg.connect(self.conninfo) as conn:
            row = conn.execute(BENCH_ROWS_STATE, {"lo": self.lo, "hi": self.hi}).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def delete(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("DELETE FROM payments WHERE id BETWEEN %(lo)s AND %(hi)s", {"lo": self.lo, "hi": self.hi})
            conn.execute("VACUUM (ANALYZE) payments")


def drain_process(url: str, ready: Barrier, out: Queue[EndReport], setup: Callable[[], tuple[Any, Any]]) -> None:
    """A bench worker process: the payments worker drains the queue with the settings and handler `setup()` builds
    in this process, once `ready` releases it; its end time, or its error as text, goes to `out`."""
    try:
        from batch_assets.db.engine import create_engine
        from batch_assets.reference.payments.worker import run_worker

        engine = create_engine(url, pool_size=2)
        settings, handler = setup()
        ready.wait(timeout=120)
        run_worker(engine, settings, handler=handler, drain=True)
        out.put(time.monotonic())
        engine.dispose()
    except BaseException as exc:  # reported to the parent, which raises
        out.put(f"{type(exc).__name__}: {exc}")


def run_processes(ctx: SpawnContext, target: Callable[..., None], url: str, args: tuple[object, ...],
                   *, before_join: Callable[[], None] | None = None) -> float:
    """Start WORKER_PROCESSES of `target`, release them together, return seconds until the last ends.

    `before_join` reads what else the processes put on their queues: a process ends only once its queue is drained.
    """
    ready = ctx.Barrier(WORKER_PROCESSES + 1)
    out: Queue[EndReport] = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, ready, out, *args), daemon=True) for _ in range(WORKER_PROCESSES)]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=120)
        started = time.monotonic()
        ends = [out.get(timeout=900) for _ in procs]
        times: list[float] = []
        for end in ends:
            if isinstance(end, str):
                raise RuntimeError(f"bench worker failed: {end}")
            times.append(end)
        if before_join is not None:
            before_join()
        return max(times) - started
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
