"""What batch_assets knows of one code location: its jobs, its queues, its declarations and its migrations.

Two kinds of code location use batch_assets:

* this repository's own (`batch_assets.definitions`): the reference project's jobs, the library's relay and
  retention, and the team's declarations under BATCH_ASSETS_DEFS_DIR;
* a team's own Dagster project, which loads `SweepComponent` and `TableQueueComponent` declarations from its defs
  folder like any other component (`Project.for_team`, found by the CLI from the project's pyproject.toml).

The CLI resolves a job, a queue or the migrations through the `Project` in use (`current()`); the run coordinator
and the code location's sensors use this repository's. A job's spec is resolved once, at the command's entrance,
and handed on.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch_assets.db.migrate import MigrationSet
from batch_assets.db.privileges import Privilege, declared_sweep
from batch_assets.errors import ConfigError
from batch_assets.orchestration.components.loader import DeclarationError, Declarations, from_config_error
from batch_assets.orchestration.defaults import REPOSITORY, LocationDefaults
from batch_assets.orchestration.spec import JobSpec

LIBRARY_JOB_MODULES: dict[str, tuple[str, ...]] = {
    "batch_assets.orchestration.outbox_job": ("outbox_relay_job",),
    "batch_assets.orchestration.retention_job": ("retention_job",),
}
"""The library's own jobs (the outbox relay, retention), as a project lists its jobs: whatever code location runs
them, their names and locks are taken in every database the library is installed in."""
LIBRARY_JOBS: tuple[str, ...] = tuple(name for names in LIBRARY_JOB_MODULES.values() for name in names)

DEFAULT_PROJECT = "batch_assets.reference.project:PROJECT"
"""This repository's code location: what `current()` is when no command chose another (imported by name: the
library does not depend on the reference project; the run coordinator of this repository's instance uses it)."""


@dataclass(frozen=True)
class Project:
    """One code location as batch_assets sees it."""

    name: str
    """The code location's name (its runs carry it, so CLI runs show under it in the UI)."""
    module: str
    """The module that holds the code location's definitions: jobs are reconstructed from it."""
    attribute: str = "defs"
    """The `Definitions` (or the `@dg.definitions` function) in `module`."""
    job_modules: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The location's own jobs: a module declaring `SPEC` → the job names that spec answers for (a module is
    imported only when one of its jobs is asked for)."""
    queue_targets: tuple[str, ...] = ()
    """`module:NAME` of each of the location's own queues (not declared in a defs.yaml)."""
    migrations: tuple[MigrationSet, ...] = ()
    """The location's own migration sets, applied after the library's (which is always applied first)."""
    privileges: Mapping[str, tuple[Privilege, ...]] = field(default_factory=dict)
    """The location's own jobs (by op job name) → the grants they need on the location's own tables, besides what
    their specs name (the library's bookkeeping): checked before the CLI launches one."""
    defaults: LocationDefaults = REPOSITORY
    declarations: Callable[[], Declarations] = Declarations
    """The location's declarations (defs.yaml components) and the ones that cannot work."""
    root: Path | None = None
    """A team project's root directory (None: this repository's own location)."""
    _cache: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    # --- jobs -----------------------------------------------------------------------------------------

    @property
    def is_team(self) -> bool:
        return self.root is not None

    def own_specs(self) -> tuple[JobSpec, ...]:
        """The location's own jobs (imported on first use)."""
        return tuple(self._spec_in(module) for module in self.job_modules)

    def _spec_in(self, module: str) -> JobSpec:
        spec: JobSpec = importlib.import_module(module).SPEC
        return spec

    def reserved_names(self) -> frozenset[str]:
        """The names a declaration may not take: the location's own jobs, the library's, and what their names give
        (a job `X_job` locks and checkpoints `X`, `X_asset_job` materializes the asset `X`, `X_queue_job` works the
        queue `X`), and the location's own queues. Derived from `job_modules` and `queue_targets` (no module of a
        job is imported); a declaration of one of these names would share that job's lock, run history,
        checkpoints or queue state."""
        names: set[str] = set(LIBRARY_JOBS)
        names.update(name for jobs in self.job_modules.values() for name in jobs)
        for job in tuple(names):
            for suffix in ("_asset_job", "_queue_job", "_job"):
                if job.endswith(suffix) and len(job) > len(suffix):
                    names.add(job.removesuffix(suffix))
        names.update(self._own_queues())
        return frozenset(names)

    def vetted(self) -> tuple[tuple[Any, ...], tuple[ConfigError, ...]]:
        """The declarations (`Loaded`) whose names are their own, and every declaration that cannot work: the
        loader's errors, a name the location reserves (`reserved_names`), a name an earlier file declares (the
        second file is named). Sweeps and queues share one namespace: a name is a lock, a checkpoint and a queue."""
        try:
            found = self.declarations()
        except ConfigError as exc:  # the declarations folder itself is unusable
            return (), (exc,)
        with _LOCK:
            cached = self._cache.get("vetted")
            if cached is not None and cached[0] is found:
                return cached[1], cached[2]
            reserved = self.reserved_names() if found.components else frozenset()  # (imports the own queues)
            seen: dict[str, Path] = {}
            ok: list[Any] = []
            errors: list[ConfigError] = list(found.errors)
            for loaded in found.components:
                name = getattr(loaded.component, "name", None)
                problem = None
                if name in reserved:
                    problem = (f"{name!r} is a name of the code location's own (one of its jobs, locks, checkpoints "
                               "or queues): choose another")
                elif name in seen:
                    problem = f"{name!r} is already declared in {seen[name]}"
                if problem is not None:
                    error = DeclarationError(loaded.path, "name", problem)
                    error.declares = name
                    errors.append(error)
                    continue
                if isinstance(name, str):
                    seen[name] = loaded.path
                ok.append(loaded)
            vetted = (tuple(ok), tuple(errors))
            self._cache["vetted"] = (found, *vetted)
            return vetted

    def declared(self) -> tuple[tuple[JobSpec, ...], list[ConfigError]]:
        """The declared jobs that can be built, and the declarations that cannot work (each names its file and
        attribute). Built once per state of the declarations."""
        specs, errors, _ = self._declared()
        return specs, errors

    def built_declarations(self) -> list[Any]:
        """The declarations (`Loaded`: path and component) whose jobs were built."""
        return self._declared()[2]

    def _declared(self) -> tuple[tuple[JobSpec, ...], list[ConfigError], list[Any]]:
        components, vetted_errors = self.vetted()
        with _LOCK:
            cached = self._cache.get("declared")
            if cached is not None and cached[0] is components and cached[1] is vetted_errors:
                return cached[2], cached[3], cached[4]
            taken = {name for names in self.job_modules.values() for name in names}
            specs: list[JobSpec] = []
            errors: list[ConfigError] = list(vetted_errors)
            ok: list[Any] = []
            for loaded in components:
                try:
                    built = list(loaded.component.built_specs(self.defaults, loaded.path.parent))
                except ConfigError as exc:
                    errors.append(from_config_error(loaded.path, exc))
                    continue
                clash = next((name for spec in built for name in spec.job_names if name in taken), None)
                if clash is not None:
                    clashing = DeclarationError(loaded.path, "name", f"{clash!r} is already a job of the code location")
                    clashing.declares = clash
                    errors.append(clashing)
                    continue
                taken.update(name for spec in built for name in spec.job_names)
                specs.extend(built)
                ok.append(loaded)
            self._cache["declared"] = (components, vetted_errors, tuple(specs), errors, ok)
            return tuple(specs), errors, ok

    def all_specs(self) -> tuple[JobSpec, ...]:
        """The location's own jobs and every declared job that can be built."""
        return (*self.own_specs(), *self.declared()[0])

    def spec_for(self, job_name: str) -> JobSpec:
        """The spec of a job by any of its names (op job, executor variant, asset job); ConfigError naming `job`
        when there is none. Only the module of that job is imported (or the declarations, for a declared job)."""
        module = next((module for module, names in self.job_modules.items() if job_name in names), None)
        if module is not None:
            return self._spec_in(module)
        found = next((spec for spec in self.declared()[0] if job_name in spec.job_names), None)
        if found is not None:
            return found
        known = ", ".join(spec.name for spec in self.all_specs())
        raise ConfigError(f"unknown job {job_name!r}; known: {known or 'none'}", field="job")

    def privileges_of(self, spec: JobSpec) -> tuple[Privilege, ...]:
        """The grants a run of `spec` needs: its own (the library's bookkeeping, a queue's table), those the location
        lists for it (`privileges`) and, for a declared sweep, those on the team's table and the outbox its events go
        to (docs/production/privileges.md)."""
        from batch_assets.orchestration.components.sweep_component import SweepComponent

        for loaded in self.built_declarations():
            component = loaded.component
            if isinstance(component, SweepComponent) and any(
                    built is spec for built in component.built_specs(self.defaults, loaded.path.parent)):
                read = (component.key, *component.columns, *((component.due,) if component.due else ()))
                outbox = self.defaults.outbox_table if component.event else None
                return declared_sweep(component.table, read, component.writes, outbox)
        return (*spec.privileges, *self.privileges.get(spec.name, ()))

    # --- queues ---------------------------------------------------------------------------------------

    def _own_queues(self) -> dict[str, Any]:
        """The location's own queues by name (not declared in a defs.yaml)."""
        queues: dict[str, Any] = {}
        for target in self.queue_targets:
            module, _, name = target.partition(":")
            declaration = getattr(importlib.import_module(module), name)
            queues[declaration.name] = declaration
        return queues

    def queues(self) -> dict[str, tuple[Path | None, Any]]:
        """Every queue by name: the location's own (no file) and each declared one with its file. A declaration that
        cannot work (a reserved or repeated name included) is left out here (`find_queue` names it)."""
        from batch_assets.orchestration.components.table_queue import TableQueueComponent

        queues: dict[str, tuple[Path | None, Any]] = {name: (None, own) for name, own in self._own_queues().items()}
        for loaded in self.vetted()[0]:
            if isinstance(loaded.component, TableQueueComponent):
                queues[loaded.component.name] = (loaded.path, loaded.component)
        return queues

    def default_queue(self) -> str | None:
        """The queue `--queue` defaults to: the location's own first queue (payments here), else the only one."""
        queues = self.queues()
        own = [name for name, (path, _) in queues.items() if path is None]
        if own:
            return own[0]
        return next(iter(queues)) if len(queues) == 1 else None

    def find_queue(self, name: str | None) -> tuple[Path | None, Any]:
        """The queue `--queue NAME` names; a ConfigError naming the file and the attribute when its declaration
        cannot work, or naming `queue` when no queue has that name."""
        queues = self.queues()
        wanted = name if name is not None else self.default_queue()
        errors = self.vetted()[1]
        for error in errors:  # a broken declaration of that name: never another queue of the name in its place
            if wanted is not None and getattr(error, "declares", None) == wanted:
                raise error
        if wanted is not None and wanted in queues:
            return queues[wanted]
        for error in errors:
            if getattr(error, "declares", None) is None:
                raise error
        if wanted is None:
            raise ConfigError(f"give --queue NAME; declared: {', '.join(sorted(queues)) or 'none'}", field="queue")
        raise ConfigError(f"no queue named {wanted!r}; declared: {', '.join(sorted(queues)) or 'none'}",
                          field="queue")

    def checked_queues(self, engine: Any, *, only: set[Path | None] | None = None) -> list[tuple[Path | None, Any]]:
        """Every queue's store (of the files in `only`; None stands for the location's own queues), its table
        checked: what `db migrate` installs on. A broken queue declaration, or a table lacking a column the queue
        needs, is a ConfigError naming the file and the attribute."""
        for error in self.vetted()[1]:
            if _declares_a_queue(getattr(error, "path", None)):
                raise error
        found: list[tuple[Path | None, Any]] = []
        for _, (path, declaration) in sorted(self.queues().items()):
            if only is not None and path not in only:
                continue
            try:
                found.append((path, declaration.checked_store(engine)))
            except ConfigError as exc:
                raise (from_config_error(path, exc) if path is not None else exc) from None
        return found


_LOCK = threading.RLock()


def _declares_a_queue(path: Path | None) -> bool:
    if path is None:
        return False
    try:
        return "TableQueueComponent" in path.read_text(encoding="utf-8")
    except OSError:
        return False


_CURRENT: list[Project] = []


def use(project: Project) -> Project:
    """Make `project` the one this process's commands act on (the CLI, after finding it)."""
    _CURRENT[:] = [project]
    return project


def current() -> Project:
    """The project in use: the one a command chose, else this repository's own code location."""
    if not _CURRENT:
        module, _, name = DEFAULT_PROJECT.partition(":")
        _CURRENT.append(getattr(importlib.import_module(module), name))
    return _CURRENT[0]


def install_queues(engine: Any, stores: Sequence[tuple[Path | None, Any]]) -> list[str]:
    """`db migrate`'s part for the queues: on each queue's table its claim token, claim, processing and failed
    indexes and wake-up trigger (safe to run again), under the migration lock. Returns the queue names."""
    from batch_assets.db.migrate import MIGRATION_LOCK_KEY

    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_advisory_lock(%(k)s)", {"k": MIGRATION_LOCK_KEY})
        conn.commit()
        try:
            for _, store in stores:
                with conn.begin():
                    store.install(conn)
        finally:
            conn.exec_driver_sql("SELECT pg_advisory_unlock(%(k)s)", {"k": MIGRATION_LOCK_KEY})
            conn.commit()
    return [store.name for _, store in stores]
