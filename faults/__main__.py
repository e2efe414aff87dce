"""`python -m faults [--quick] [--seed N] [--output PATH] [--only TEXT] [--keep]`.

Exit 0 when every injected fault kept every invariant, every bad input was refused
and no secret was found; 1 otherwise; 2 on bad arguments. Everything the campaign
starts is stopped in a `finally`, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from faults import fuzz
from faults.campaign import FULL, QUICK, Campaign, log, make_root, plan, remove_root
from faults.product import REPO
from faults.report import render


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faults", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="15 faults, one of each kind (CI); writes a temp report")
    p.add_argument("--seed", type=int, default=None, help="the campaign seed (default: the time)")
    p.add_argument("--output", default=None, help="report path (default docs/reliability.md; quick: a temp file)")
    p.add_argument("--only", action="append", default=None,
                   help="run only the faults whose label contains this text (repeatable: any of them)")
    p.add_argument("--no-fuzz", action="store_true", help="skip the bad-input fuzzing")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (server data, logs) for a post-mortem")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    sizes = QUICK if args.quick else FULL
    if args.output:
        output = Path(args.output)
    elif args.quick:
        output = Path(tempfile.gettempdir()) / f"reliability-quick-{seed}.md"
    else:
        output = REPO / "docs" / "reliability.md"
    command = "python -m faults" + (" --quick" if args.quick else "") + f" --seed {seed}"
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored (a background job)
    root = make_root()
    campaign = Campaign(root, seed, sizes)
    started = time.monotonic()
    log(f"seed {seed}; work dir {root}; report {output}")
    failed = True
    try:
        campaign.start()
        campaign.build_templates()
        specs = plan(sizes, campaign.rng, quick=args.quick, redis=campaign.redis is not None,
                     brokers=campaign.brokers())
        if campaign.redis is None:
            campaign.skipped.append("lock-store (Redis) faults: redis-server is not installed")
        for broker in sorted({"rabbitmq", "nats"} - set(campaign.brokers())):
            campaign.skipped.append(f"outbox broker faults ({broker}): the broker is not available")
        if args.only:
            specs = [s for s in specs if any(text in s.label for text in args.only)]
        log(f"{len(specs)} faults planned")
        for i, spec in enumerate(specs, 1):
            campaign.results.append(campaign.run_fault(spec, i))
        if not args.no_fuzz:
            _fuzz(campaign, quick=args.quick)
        campaign.secret_scan()
        failed = (
            any(r.outcome in ("FAIL", "error") for r in campaign.results)
            or any(not r["ok"] for r in campaign.fuzz + campaign.config_fuzz)
            or bool(campaign.secrets.get("hits"))
        )
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(render(campaign, command=command, duration_s=time.monotonic() - started, failed=failed))
        log(f"report written to {output}")
    except KeyboardInterrupt:
        log("interrupted: stopping everything the campaign started")
        return 130
    finally:
        campaign.stop()
        if args.keep:
            log(f"kept {root}")
        else:
            remove_root(root)
    counts = {k: sum(1 for r in campaign.results if r.outcome == k)
              for k in ("pass", "FAIL", "known failure", "not injected", "error")}
    bad_fuzz = sum(1 for r in campaign.fuzz + campaign.config_fuzz if not r["ok"])
    log(f"faults: {counts}; bad input not refused: {bad_fuzz}; secrets found: {len(campaign.secrets.get('hits', []))}"
        f"; {(time.monotonic() - started) / 60:.1f} min; {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0


def _fuzz(campaign: Campaign, *, quick: bool) -> None:
    db = fuzz.FUZZ_DB
    campaign.pg.create_database(db)
    rd = campaign.run_date.isoformat()
    campaign.must(db, "db", "migrate")
    campaign.must(db, "seed", "customers", "--rows", "2000", "--due-fraction", "0.2", "--run-date", rd)
    campaign.must(db, "seed", "subscriptions", "--rows", "200", "--run-date", rd)
    campaign.must(db, "queue", "enqueue", "--count", "50")
    engine = campaign.admin(db)
    t = time.monotonic()

    def run(cli_args: list[str], env_changes: dict[str, str | None]):
        env = campaign.env_for(db)
        for k, v in env_changes.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return campaign.cli(db, *cli_args, env=env, timeout=60)

    try:
        campaign.fuzz = fuzz.run_cli_fuzz(run, engine, rd, quick=quick)
    finally:
        engine.dispose()
    campaign.config_fuzz = fuzz.run_config_fuzz()
    bad = [r["case"] for r in campaign.fuzz + campaign.config_fuzz if not r["ok"]]
    log(f"bad input: {len(campaign.fuzz)} CLI cases, {len(campaign.config_fuzz)} config cases in "
        f"{time.monotonic() - t:.0f}s; not refused: {len(bad)}")
    campaign.pg.drop_database(db)


if __name__ == "__main__":
    sys.exit(main())
