"""`batch-assets`: the one command line (docs/reference/cli.md): the parser, the dispatch, the exit codes.

Rules every command keeps:
- progress and messages go to stderr; a job command's last line of stdout is
  one JSON object (its summary), whatever the outcome;
- exit codes: 0 success, 1 the run failed, 2 bad usage or configuration
  (nothing was written), 75 skipped because another run holds the lock;
- configuration is validated before anything is read or written;
- no secret (database password, key, decrypted value) is ever printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from batch_assets.cli import db, jobs, launcher, outbox, queue, retention, rules, seed, subscriptions, sweep, tools
from batch_assets.cli.args import Parser
from batch_assets.cli.output import emit, empty_summary, err, looks_like_job
from batch_assets.cli.startup import resume_collector
from batch_assets.db.privileges import is_insufficient_privilege, permission_denied
from batch_assets.errors import (
    EXIT_FAILED,
    EXIT_SKIPPED,
    BatchAssetsError,
    ConfigError,
    first_line,
)
from batch_assets.extras import missing_extra
from batch_assets.orchestration.instance_home import write_instance_config
from batch_assets.settings import Settings, load_settings

GROUPS = (db, seed, sweep, subscriptions, queue, outbox, rules, jobs, retention, tools)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="batch-assets", description="Fast, safe batch sweeps, queue and nightly jobs on PostgreSQL.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.register(sub)
    # The launcher's forked processes run this command line; it is handed over, the launcher cannot import it.
    launcher.register(sub, launcher.CommandLine(main=main, build_parser=build_parser))
    return p


JOB_COMMANDS = {sweep.cmd_sweep, subscriptions.cmd_subscriptions_expire, queue.cmd_queue_work, outbox.cmd_outbox_relay,
                jobs.cmd_jobs_run, retention.cmd_retention_run}


# Dagster's API-stability notices (an API "is currently in beta/preview", "is superseded") speak to the developers
# of this code, not to an operator: on the CLI's stderr they would bury the one line an error gets
# (docs/reference/cli.md).
DAGSTER_API_NOTICES = r".* is (currently in (beta|preview)|superseded)"


def main(argv: Sequence[str] | None = None) -> int:
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=DAGSTER_API_NOTICES)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    func = None
    try:
        args = parser.parse_args(argv)
        func = args.func
        if func not in JOB_COMMANDS:  # a job command resumes it once its job's modules are in (run_job)
            resume_collector()
        settings = choose_project(load_settings())
        return func(args, settings)
    except BatchAssetsError as exc:
        return refused(exc, func, argv)
    except KeyboardInterrupt:
        err("interrupted")
        if func in JOB_COMMANDS:
            emit(empty_summary("FAILURE", error="interrupted"))
        return EXIT_FAILED
    except Exception as exc:  # a defect: one line (no secrets: no locals, no values), JSON for job commands
        refusal = missing_extra(exc) if isinstance(exc, ModuleNotFoundError) else None
        if refusal is not None:  # not a defect: the feature's optional library is not installed
            return refused(refusal, func, argv)
        if is_insufficient_privilege(exc):  # not a defect: the role lacks a grant (exit 2, naming the object)
            return refused(permission_denied(exc), func, argv)
        refusal = None if func in JOB_COMMANDS else unmigrated(exc)
        if refusal is not None:  # not a defect: a table `db migrate` creates is missing (a job is refused earlier)
            err(f"error: {refusal}")
            return refusal.exit_code
        err(f"error: unexpected {type(exc).__name__}: {first_line(str(exc))}")
        if func in JOB_COMMANDS:
            emit(empty_summary("FAILURE", error=f"unexpected {type(exc).__name__}"))
        return EXIT_FAILED
    finally:
        resume_collector()


def refused(exc: BatchAssetsError, func: object, argv: Sequence[str] | None) -> int:
    """One line on stderr and, for a job command, its JSON line; the error's exit code."""
    err(f"error: {exc}")
    if func in JOB_COMMANDS or (func is None and looks_like_job(sys.argv[1:] if argv is None else argv)):
        status = "SKIPPED" if exc.exit_code == EXIT_SKIPPED else "FAILURE"
        emit(empty_summary(status, error=str(exc)))
    return exc.exit_code


def choose_project(settings: Settings) -> Settings:
    """The code location the command acts on: the team's project the working directory is in (its declarations, its
    DAGSTER_HOME, never an embedded server nor a rewritten dagster.yaml), else this repository's own, whose every
    command (`db migrate` included) leaves DAGSTER_HOME with our instance file (the production steps)."""
    from batch_assets.orchestration.discovery import discover

    team = discover()
    if team is not None:
        from batch_assets.orchestration.project import use

        use(team)
        return dataclasses.replace(settings, embedded_allowed=False)
    write_instance_config(settings)
    return settings


def unmigrated(exc: BaseException) -> ConfigError | None:
    """The ConfigError to show instead of `exc` when `exc` is "relation ... does not exist" on a database with
    migrations pending (`db migrate` not run): it names them and the command. None for anything else."""
    from batch_assets.db.engine import one_off_engine
    from batch_assets.db.migrate import is_undefined_table, require_migrated
    from batch_assets.orchestration.project import current

    if not is_undefined_table(exc):
        return None
    try:
        settings = choose_project(load_settings())
        with one_off_engine(settings) as engine:
            require_migrated(engine, current().migrations)
    except ConfigError as refusal:
        return refusal
    except Exception:  # the database is gone now: the original error stands
        return None
    return None
