"""`batch-assets queue ...`: the task queues (docs/guide/payment-queue.md, docs/reference/declarations.md). Without
`--queue`, the payments queue."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from batch_assets.cli.args import (
    add_setting,
    at_least_one,
    priority_value,
    seed_value,
)
from batch_assets.cli.common import (
    build_config,
    engine_of,
    run_job,
)
from batch_assets.cli.output import emit, err
from batch_assets.db.engine import connected_engine
from batch_assets.errors import (
    EXIT_OK,
    ConfigError,
)
from batch_assets.settings import Settings

_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9]{1,19}", re.ASCII | re.I)


def row_id(text: str) -> str:
    """An id as `queue dlq list` prints it: a UUID (8-4-4-4-12 hex digits) or a whole number."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"id must not be empty, got {text!r}")
    if not _ID_RE.fullmatch(text):
        shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"id must be a UUID (8-4-4-4-12 hex digits) or a whole number, got {shown}")
    return text


def queue_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"queue must not be empty, got {text!r}")
    return text


def _store(args: argparse.Namespace, settings: Settings) -> tuple[Any, Any]:
    """(engine, the store of `--queue`), the table checked against the declaration (exit 2 naming file and column)."""
    from batch_assets.orchestration.components.loader import from_config_error
    from batch_assets.orchestration.project import current

    path, declaration = current().find_queue(args.queue)
    engine = engine_of(declaration, settings)
    try:
        return engine, declaration.checked_store(engine)
    except ConfigError as exc:
        raise (from_config_error(path, exc) if path is not None else exc) from None


def cmd_queue_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.reference.payments.queue import enqueue

    if args.count <= 0:
        raise ConfigError(f"must be positive, got {args.count}", field="count")
    engine = connected_engine(settings)
    count = enqueue(engine, args.count, seed=args.seed, priority=args.priority)
    emit({"status": "SUCCESS", "enqueued": count, "priority": args.priority})
    return EXIT_OK


def cmd_queue_work(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.orchestration.project import current

    project = current()
    path, declaration = project.find_queue(args.queue)
    options = {"concurrency": args.concurrency, "max_seconds": args.max_seconds, "drain": bool(args.drain),
               "db_outage_s": args.db_outage_s}
    if path is None:  # the payments queue (docs/guide/payment-queue.md)
        from batch_assets.reference.payments.dagster import QueueDrainConfig
        from batch_assets.reference.payments.handler import load_plugin, plugin_spec_from_environment

        config, _ = build_config(QueueDrainConfig, settings, **options)
        spec = plugin_spec_from_environment()
        if spec:
            load_plugin(spec)  # an unimportable handler is exit 2 before anything is claimed
        connected_engine(settings)
        return run_job(project.spec_for("payment_queue_drain_job"), config, settings)
    from batch_assets.cli.jobs import checked_declarations
    from batch_assets.orchestration.queue_job import QueueWorkConfig, job_name

    work_config, _ = build_config(QueueWorkConfig, settings, **options)
    _store(args, settings)  # the table holds every column, or exit 2 naming the file and the column
    checked_declarations(settings, job_name(declaration.name))  # the handler imports (exit 2 naming the file)
    return run_job(project.spec_for(job_name(declaration.name)), work_config, settings,
                   extra={"queue": declaration.name})


def cmd_queue_stats(args: argparse.Namespace, settings: Settings) -> int:
    engine, store = _store(args, settings)
    emit({"status": "SUCCESS", **store.stats(engine)})
    return EXIT_OK


def cmd_queue_dlq_list(args: argparse.Namespace, settings: Settings) -> int:
    engine, store = _store(args, settings)
    if args.csv:
        return _dlq_csv(engine, store, args.limit)
    rows = store.dlq_list(engine, limit=args.limit or 100)
    shown = [c for c in store.sql.dlq_columns if c not in (store.spec.key, "attempts", "last_error")][:3]
    for row in rows:
        err(f"{row[store.spec.key]}  attempts={row['attempts']}  "
            + "  ".join(f"{c}={row.get(c)}" for c in shown if not c.endswith("_at"))
            + f"  last_error={row.get('last_error')}")
    emit({"status": "SUCCESS", "queue": store.name, "count": len(rows), "items": rows})
    return EXIT_OK


def _dlq_csv(engine: Any, store: Any, limit: int | None) -> int:
    """The DLQ as CSV on stdout (for people), written page by page so memory stays one page. A NULL is an empty
    field; every other value is written as its text."""
    import csv

    page_size, written, after = 1000, 0, None
    writer = csv.DictWriter(sys.stdout, fieldnames=list(store.sql.dlq_columns), extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    while True:
        wanted = page_size if limit is None else min(page_size, limit - written)
        rows = store.dlq_list(engine, limit=wanted, after_id=after) if wanted > 0 else []
        writer.writerows(rows)
        written += len(rows)
        if len(rows) < wanted or not rows:
            break
        after = rows[-1][store.spec.key]
    sys.stdout.flush()
    err(f"{written} failed row(s) of {store.name}")
    return EXIT_OK


def cmd_queue_dlq_replay(args: argparse.Namespace, settings: Settings) -> int:
    engine, store = _store(args, settings)
    ids = None
    if args.id:
        try:
            ids = [store.key_value(i) for i in args.id]
        except ConfigError as exc:
            raise ConfigError(str(exc).removeprefix("ids: "), field="id") from None
    result = store.dlq_replay(engine, ids)
    emit({"status": "SUCCESS", "queue": store.name, "replayed": result})
    return EXIT_OK


def _queue_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", type=queue_name, default=None,
                        help="a queue declared under BATCH_ASSETS_DEFS_DIR (default: payments)")


def register(sub: Any) -> None:
    """queue enqueue | work | stats | dlq list | dlq replay"""
    queue = sub.add_parser("queue", help="the task queues (default: payments)").add_subparsers(
        dest="queue_command", required=True)
    en = queue.add_parser("enqueue", help="enqueue NEW payments")
    en.add_argument("--count", type=at_least_one("count"), required=True)
    en.add_argument("--seed", type=seed_value, default=None)
    en.add_argument("--priority", type=priority_value, default=0,
                    help="higher is claimed first; a due payment gains 1 per minute it waits (default 0)")
    en.set_defaults(func=cmd_queue_enqueue)
    from batch_assets.queue.settings import QueueRunSettings

    wk = queue.add_parser("work", help="the resident worker (until SIGTERM/SIGINT, --max-seconds or --drain)")
    _queue_option(wk)
    add_setting(wk, QueueRunSettings, "concurrency")
    add_setting(wk, QueueRunSettings, "max_seconds")
    add_setting(wk, QueueRunSettings, "drain", help="exit once nothing is due (default: the resident worker)")
    add_setting(wk, QueueRunSettings, "db_outage_s")
    wk.set_defaults(func=cmd_queue_work)
    st = queue.add_parser("stats", help="counts by status, oldest_due_s, dlq_size, breaker (JSON)")
    _queue_option(st)
    st.set_defaults(func=cmd_queue_stats)
    dlq = queue.add_parser("dlq", help="the FAILED rows").add_subparsers(dest="dlq_command", required=True)
    dl = dlq.add_parser("list")
    _queue_option(dl)
    dl.add_argument("--limit", type=at_least_one("limit"), default=None, help="default: 100 (JSON), all (--csv)")
    dl.add_argument("--csv", action="store_true", help="CSV on stdout instead of JSON")
    dl.set_defaults(func=cmd_queue_dlq_list)
    dr = dlq.add_parser("replay")
    _queue_option(dr)
    dr.add_argument("--id", action="append", type=row_id, default=None, help="row id (repeatable); default: all")
    dr.set_defaults(func=cmd_queue_dlq_replay)
