"""`batch-assets jobs list` / `jobs run NAME [--set FIELD=VALUE ...]`: every registered job, by name.

The job commands (sweep, subscriptions expire, queue work, outbox relay; docs/reference/cli.md) have their
own options; these two read the job registry, so a job added with one registry line can be listed,
inspected and launched from the command line at once, with its config validated exactly as the
other commands do it (a bad field is exit 2, naming it, before anything runs).
"""

from __future__ import annotations

import argparse
import enum
import json
from typing import TYPE_CHECKING, Any

from batch_assets.cli.common import build_config, engine_of, run_job
from batch_assets.cli.output import emit
from batch_assets.errors import EXIT_OK, ConfigError
from batch_assets.settings import Settings

if TYPE_CHECKING:
    from batch_assets.orchestration.config import JobConfig


def _fields(config: type[JobConfig]) -> list[dict[str, Any]]:
    model = getattr(config, "settings_model", None)  # the job's settings model holds the bounds (config_class)
    fields = []
    for name, info in config.model_fields.items():
        source = model.model_fields.get(name, info) if model is not None else info
        bounds = {k: getattr(m, k) for m in source.metadata for k in ("ge", "gt", "le", "lt")
                  if getattr(m, k, None) is not None}
        choices = [m.value for m in info.annotation] if isinstance(info.annotation, enum.EnumMeta) else None
        fields.append({"name": name, "type": "str" if choices else getattr(info.annotation, "__name__",
                                                                            str(info.annotation)),
                       "default": getattr(info.default, "value", info.default), **bounds,
                       **({"choices": choices} if choices else {}), "description": info.description or ""})
    return fields


def checked_declarations(settings: Settings, job: str | None = None) -> None:
    """ConfigError (exit 2: one line naming the file and the attribute) for a declaration that cannot work.

    `jobs list` checks every declaration; `jobs run NAME` the one declaring NAME (and, when NAME is no job, any
    broken one, since it may be the one meant). Checked against the database too: its columns, key and types."""
    from batch_assets.orchestration.components.loader import from_config_error
    from batch_assets.orchestration.project import current

    project = current()
    _, errors = project.declared()
    known = {n for spec in project.all_specs() for n in spec.job_names}
    for error in errors:
        declares = getattr(error, "declares", None)
        if job is None or declares in (None, job) or job not in known:
            raise error
    components = [c for c in project.built_declarations()
                  if job is None or any(job in spec.job_names for spec in c.component.built_specs(project.defaults))]
    for loaded in components:
        try:
            loaded.component.check_database(engine_of(loaded.component, settings))
        except ConfigError as exc:
            raise from_config_error(loaded.path, exc) from None


def cmd_jobs_list(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.orchestration.project import current

    checked_declarations(settings)
    jobs = [
        {
            "name": spec.name,
            "description": spec.job.description or "",
            "variants": sorted(spec.variants),
            "asset_jobs": [job.name for job in spec.asset_jobs],
            "config": spec.config.__name__,
            "fields": _fields(spec.config),
        }
        for spec in current().all_specs()
    ]
    emit({"status": "SUCCESS", "jobs": jobs})
    return EXIT_OK


def parse_assignment(text: str) -> tuple[str, Any]:
    """`FIELD=VALUE`; VALUE is read as JSON when it is JSON (5, 0.5, true), else as a string.

    An empty VALUE (`--set run_date=$UNSET`), `null`, or one with spaces around it is refused, naming the
    field: it is never read as "the default" (leave the --set out for that). An object or an array is no value
    of any field: the field's own check refuses it (`settings_model.given_value`).
    """
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise ConfigError(f"expected FIELD=VALUE, got {text!r}", field="set")
    name = name.strip()
    if not raw.strip():
        raise ConfigError(f"must not be empty (--set {name}=VALUE), got {raw!r}", field=name)
    if raw != raw.strip():
        raise ConfigError(f"must not have spaces around it, got {raw!r}", field=name)
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if value is None:
        raise ConfigError(f"must be a value, got {raw!r} (leave out --set {name} for its default)", field=name)
    return name, value


def cmd_jobs_run(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.orchestration.project import current

    checked_declarations(settings, args.job)
    spec = current().spec_for(args.job)
    values = dict(parse_assignment(item) for item in args.set or [])
    unknown = sorted(set(values) - set(spec.config.model_fields))
    if unknown:
        raise ConfigError(f"{spec.config.__name__} has no field {unknown[0]!r}", field=unknown[0])
    config, _ = build_config(spec.config, settings, **values)
    return run_job(spec, config, settings)


def register(sub: Any) -> None:
    """jobs list | jobs run NAME [--set FIELD=VALUE ...]"""
    jobs = sub.add_parser("jobs", help="every registered job").add_subparsers(dest="jobs_command", required=True)
    jobs.add_parser("list", help="the registered jobs and their config fields (JSON)").set_defaults(
        func=cmd_jobs_list
    )
    run = jobs.add_parser("run", help="launch a registered job by name as a Dagster run")
    run.add_argument("job", help="the job's name (see `jobs list`)")
    run.add_argument("--set", action="append", metavar="FIELD=VALUE",
                     help="a config field (repeatable); VALUE is JSON when it parses as JSON, else a string")
    run.set_defaults(func=cmd_jobs_run)
