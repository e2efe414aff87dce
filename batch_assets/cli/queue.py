"""`batch-assets queue ...`: the payment task queue (CONTRACT §7)."""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

from batch_assets.cli.args import (
    at_least_one,
    decimal,
    payment_id,
    positive,
    priority_value,
    seed_value,
)
from batch_assets.cli.common import (
    build_config,
    run_job,
)
from batch_assets.cli.output import emit, err
from batch_assets.db.engine import connected_engine
from batch_assets.errors import (
    EXIT_OK,
    ConfigError,
)
from batch_assets.settings import Settings


def cmd_queue_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.queue import enqueue

    if args.count <= 0:
        raise ConfigError(f"must be positive, got {args.count}", field="count")
    engine = connected_engine(settings)
    count = enqueue(engine, args.count, seed=args.seed, priority=args.priority)
    emit({"status": "SUCCESS", "enqueued": count, "priority": args.priority})
    return EXIT_OK


def cmd_queue_work(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.dagster import QueueDrainConfig
    from batch_assets.domains.payments.handler import load_plugin, plugin_spec_from_environment

    config, _ = build_config(QueueDrainConfig, concurrency=args.concurrency, max_seconds=args.max_seconds,
                          drain=bool(args.drain), db_outage_s=args.db_outage_s)
    spec = plugin_spec_from_environment()
    if spec:
        load_plugin(spec)  # an unimportable handler is exit 2 before anything is claimed
    connected_engine(settings)
    return run_job("payment_queue_drain_job", config, settings)


def cmd_queue_stats(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.queue import queue_stats

    emit({"status": "SUCCESS", **queue_stats(connected_engine(settings))})
    return EXIT_OK


def cmd_queue_dlq_list(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.queue import dlq_list

    engine = connected_engine(settings)
    if args.csv:
        return _dlq_csv(engine, args.limit)
    rows = dlq_list(engine, limit=args.limit or 100)
    for row in rows:
        err(f"{row['id']}  attempts={row['attempts']}  amount_cents={row['amount_cents']}  "
            f"last_error={row.get('last_error')}")
    emit({"status": "SUCCESS", "count": len(rows), "items": rows})
    return EXIT_OK


def _dlq_csv(engine: Any, limit: int | None) -> int:
    """The DLQ as CSV on stdout (for people), written page by page so memory stays one page."""
    import pandas as pd

    from batch_assets.domains.payments.queue import dlq_list

    page_size, written, after = 1000, 0, None
    columns = ["id", "amount_cents", "attempts", "last_error", "created_at", "processed_at"]
    while True:
        wanted = page_size if limit is None else min(page_size, limit - written)
        rows = dlq_list(engine, limit=wanted, after_id=after) if wanted > 0 else []
        if not rows and written:
            break
        pd.DataFrame(rows, columns=columns).to_csv(sys.stdout, index=False, header=written == 0)
        written += len(rows)
        if len(rows) < wanted or not rows:
            break
        after = rows[-1]["id"]
    sys.stdout.flush()
    err(f"{written} failed payment(s)")
    return EXIT_OK


def cmd_queue_dlq_replay(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.domains.payments.queue import dlq_replay

    ids = None
    if args.id:
        try:
            ids = [uuid.UUID(i) for i in args.id]
        except ValueError:
            raise ConfigError("every --id must be a UUID", field="id") from None
    result = dlq_replay(connected_engine(settings), ids)
    summary = result if isinstance(result, dict) else {"replayed": result}
    emit({"status": "SUCCESS", **summary})
    return EXIT_OK



def register(sub: Any) -> None:
    """queue enqueue | work | stats | dlq list | dlq replay"""
    queue = sub.add_parser("queue", help="the payment task queue").add_subparsers(dest="queue_command", required=True)
    en = queue.add_parser("enqueue", help="enqueue NEW payments")
    en.add_argument("--count", type=at_least_one("count"), required=True)
    en.add_argument("--seed", type=seed_value, default=None)
    en.add_argument("--priority", type=priority_value, default=0,
                    help="higher is claimed first; a due payment gains 1 per minute it waits (default 0)")
    en.set_defaults(func=cmd_queue_enqueue)
    wk = queue.add_parser("work", help="the resident payment worker (until SIGTERM/SIGINT, --max-seconds or --drain)")
    wk.add_argument("--concurrency", type=positive("concurrency"), default=None)
    wk.add_argument("--max-seconds", type=decimal("max_seconds"), default=None)
    wk.add_argument("--drain", action="store_true", help="exit once nothing is due")
    wk.add_argument("--db-outage-s", type=positive("db-outage-s"), default=None,
                    help="seconds a lost database connection is retried before the worker fails (default 60, max 600)")
    wk.set_defaults(func=cmd_queue_work)
    queue.add_parser("stats", help="counts by status, oldest_due_s, dlq_size, breaker (JSON)").set_defaults(
        func=cmd_queue_stats
    )
    dlq = queue.add_parser("dlq", help="the FAILED payments").add_subparsers(dest="dlq_command", required=True)
    dl = dlq.add_parser("list")
    dl.add_argument("--limit", type=at_least_one("limit"), default=None, help="default: 100 (JSON), all (--csv)")
    dl.add_argument("--csv", action="store_true", help="CSV on stdout instead of JSON")
    dl.set_defaults(func=cmd_queue_dlq_list)
    dr = dlq.add_parser("replay")
    dr.add_argument("--id", action="append", type=payment_id, default=None,
                    help="payment id (repeatable); default: all")
    dr.set_defaults(func=cmd_queue_dlq_replay)
