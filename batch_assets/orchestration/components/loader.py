"""Every defs.yaml under BATCH_ASSETS_DEFS_DIR, as Dagster components (docs/reference/declarations.md).

The folder is put first on sys.path, so the functions a declaration names can live beside it (the folder
of each defs.yaml follows it on the path: a function beside its defs.yaml in a subfolder is found by its
name). Each file is `type: <module.Class>` (a dagster.Component, e.g. batch_assets.SweepComponent or
batch_assets.TableQueueComponent) and `attributes:`; the class's own model validates them (unknown
attributes refused) and the component is built with Dagster's `Resolvable.resolve_from_model`.

A file that cannot be loaded is one `DeclarationError` (a ConfigError: exit 2) naming the file and the
attribute. `load_declarations` never raises for one: it returns the components that loaded and the errors, so
the CLI refuses to run with a broken declaration while the code location still loads everything else.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch_assets.errors import ConfigError

DEFS_DIR_ENV = "BATCH_ASSETS_DEFS_DIR"
DEFS_FILE = "defs.yaml"
MAX_DEFS_BYTES = 1024 * 1024
"""A declaration is a few hundred bytes: a defs.yaml past 1 MiB is refused before it is read (a 31 MB file cost a
minute and 0.8 GB of memory per command to parse)."""


class DeclarationError(ConfigError):
    """A declaration that cannot work: `str()` is '<file>: <attribute>: <message>'."""

    def __init__(self, path: Path, attribute: str, message: str) -> None:
        super().__init__(message, field=attribute)
        self.path = path
        self.attribute = attribute
        self.message = message
        self.declares: str | None = None
        """The job name the file declares, when it could be read (`jobs run NAME` refuses a broken NAME)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.attribute}: {self.message}"


@dataclass(frozen=True)
class Loaded:
    path: Path
    component: Any
    """A dagster.Component instance."""


@dataclass
class Declarations:
    components: list[Loaded] = field(default_factory=list)
    errors: list[DeclarationError] = field(default_factory=list)

    def of_type(self, cls: type) -> list[Loaded]:
        return [c for c in self.components if isinstance(c.component, cls)]

    def raise_first(self) -> None:
        """Raise the first error (the CLI: exit 2, one line naming the file and the attribute)."""
        if self.errors:
            raise self.errors[0]


def defs_dir() -> Path | None:
    """BATCH_ASSETS_DEFS_DIR, or None when unset (only the product's own jobs)."""
    value = os.environ.get(DEFS_DIR_ENV)
    if value is None:
        return None
    if not value.strip():
        raise ConfigError("must not be empty (unset it for only the product's own jobs)", field=DEFS_DIR_ENV)
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"{value!r} is not a folder", field=DEFS_DIR_ENV)
    return path


_CACHE: dict[tuple[str, tuple[tuple[str, int, int], ...]], Declarations] = {}


def load_declarations(folder: Path | None = None) -> Declarations:
    """Every defs.yaml under `folder` (default BATCH_ASSETS_DEFS_DIR), sorted by path; cached per file state."""
    folder = folder if folder is not None else defs_dir()
    if folder is None:
        return Declarations()
    files = sorted(folder.rglob(DEFS_FILE))
    state = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    cached = _CACHE.get((str(folder), state))
    if cached is not None:
        return cached
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    for place in sorted({str(p.parent) for p in files} - {str(folder)}):
        # A function beside its defs.yaml in a subfolder is found by its module name too (after the folder's own).
        if place not in sys.path:
            sys.path.insert(sys.path.index(str(folder)) + 1, place)
    found = Declarations()
    for path in files:
        try:
            found.components.append(Loaded(path, load_file(path)))
        except DeclarationError as exc:  # the caller shows it (the CLI: exit 2; the code location: logged)
            exc.declares = _declared_name(path)
            found.errors.append(exc)
    _CACHE[(str(folder), state)] = found
    return found


def check_size(path: Path) -> None:
    """DeclarationError naming the file when it is larger than a declaration can be (nothing of it is read)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DeclarationError(path, "type", f"not a readable YAML file: {type(exc).__name__}") from None
    if size > MAX_DEFS_BYTES:
        raise DeclarationError(path, "size", f"is {size:,} bytes; a defs.yaml may be at most {MAX_DEFS_BYTES:,} "
                               "(a declaration is a few hundred)")


def load_file(path: Path) -> Any:
    """One defs.yaml as a component; DeclarationError naming the file and the attribute."""
    import yaml

    check_size(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DeclarationError(path, "type", f"not a readable YAML file: {type(exc).__name__}") from None
    if not isinstance(document, dict):
        raise DeclarationError(path, "type", "expected a mapping with type and attributes")
    extra = sorted(set(document) - {"type", "attributes"})
    if extra:
        raise DeclarationError(path, str(extra[0]), "unknown top-level key (expected type and attributes)")
    cls = component_type(path, document.get("type"))
    attributes = document.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise DeclarationError(path, "attributes", "must be a mapping")
    return build(path, cls, attributes)


def component_type(path: Path, type_name: Any) -> type:
    """The class a declaration's `type` names: a dagster.Component subclass."""
    import dagster as dg

    if not isinstance(type_name, str) or "." not in type_name:
        raise DeclarationError(path, "type",
                               f"must be module.Class (e.g. batch_assets.SweepComponent), got {type_name!r}")
    module_name, _, attribute = type_name.rpartition(".")
    try:
        import importlib

        cls = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # noqa: BLE001 — any failure to find the type is this one error
        raise DeclarationError(path, "type", f"{type_name} cannot be imported: {type(exc).__name__}") from None
    if not isinstance(cls, type) or not issubclass(cls, dg.Component):
        raise DeclarationError(path, "type", f"{type_name} is not a dagster.Component")
    return cls


def build(path: Path, cls: type, attributes: dict[str, Any]) -> Any:
    """The component from its attributes: the class's model validates them, Dagster's resolution builds it. A value
    a template rendered (from a variable that may hold a secret) is never repeated in the error."""
    import dagster as dg
    import pydantic
    from dagster.components.resolved.errors import ResolutionException

    try:
        try:
            model = cls.model().model_validate(attributes)  # type: ignore[attr-defined]
            component = cls.resolve_from_model(dg.ResolutionContext.default(), model)  # type: ignore[attr-defined]
        except pydantic.ValidationError as exc:
            raise validation_error(path, exc) from None
        except ConfigError as exc:
            raise from_config_error(path, exc) from None
        except ResolutionException as exc:
            raise template_error(path, cls, exc, attributes) from None
        except Exception as exc:  # noqa: BLE001 — a resolution failure of the team's file
            raise DeclarationError(path, "attributes", f"{type(exc).__name__}: {exc}".splitlines()[0]) from None
        check = getattr(component, "check_static", None)
        if check is not None:
            try:
                check()
            except ConfigError as exc:
                raise from_config_error(path, exc) from None
    except DeclarationError as exc:
        raise redacted(exc, cls, attributes) from None
    return component


def validation_error(path: Path, exc: Any) -> DeclarationError:
    """pydantic's first error as the DeclarationError of its attribute."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "attributes"
    message = "unknown attribute" if first.get("type") == "extra_forbidden" else \
        str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return DeclarationError(path, where, message)


RENDERED = "(the value its template rendered)"


def redacted(error: DeclarationError, cls: type, attributes: dict[str, Any]) -> DeclarationError:
    """`error` with every value a template among the attributes rendered replaced by RENDERED."""
    message = error.message
    for value in sorted(_rendered(cls, attributes), key=len, reverse=True):
        message = message.replace(repr(value), RENDERED)
        if len(value) >= 4:  # a shorter one is no secret worth a mangled message
            message = message.replace(value, RENDERED)
    if message == error.message:
        return error
    clean = DeclarationError(error.path, error.attribute, message)
    clean.declares = error.declares
    return clean


def _rendered(cls: type, attributes: dict[str, Any]) -> set[str]:
    """What each template among the attributes renders to (the attributes taken as written aside)."""
    import dagster as dg

    context = dg.ResolutionContext.default()
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and ("{{" in value or "{%" in value):
            try:
                rendered = context.resolve_value(value)
            except Exception:  # noqa: BLE001 — a template that does not render shows nothing
                return
            if rendered is not None and str(rendered) and str(rendered) != value:
                found.add(str(rendered))

    literal = _literal(cls)
    for name, value in attributes.items():
        if name not in literal:
            walk(value)
    return found


def as_written(context: Any, raw: Any) -> Any:
    """A Dagster resolver's function for an attribute taken exactly as the defs.yaml has it: never a template."""
    return raw


def _literal(cls: type) -> set[str]:
    """The attributes taken as written (`as_written`, e.g. a sweep's `where`): no template is ever rendered there."""
    return {name for name, info in getattr(cls, "model_fields", {}).items()
            if any(getattr(getattr(m, "fn", None), "callable", None) is as_written for m in info.metadata)}


def template_error(path: Path, cls: type, exc: Exception, attributes: dict[str, Any]) -> DeclarationError:
    """The DeclarationError of the attribute whose Dagster template does not render: the field Dagster names, else
    each attribute rendered on its own until one fails (an attribute taken as written never is). Only the
    template's own words are shown (an undefined name, a syntax error), never what a variable holds."""
    import re

    import dagster as dg
    from dagster.components.resolved.errors import ResolutionException

    named = re.search(r"Resolver for field '([A-Za-z_][A-Za-z0-9_]*)'", str(exc))
    if named is not None:  # the component's own resolver refused the value: its ValueError says why, without it
        last = [line.strip() for line in str(exc).splitlines() if line.strip()][-1]
        reason = last.split(": ", 1)[1] if last.startswith("ValueError: ") else _template_reason(exc)
        return DeclarationError(path, named.group(1), reason)
    context = dg.ResolutionContext.default()
    literal = _literal(cls)
    for name, value in attributes.items():
        if name in literal:
            continue
        try:
            context.at_path(name).resolve_value(value)
        except ResolutionException as failed:
            return DeclarationError(path, str(name), f"its template does not render: {_template_reason(failed)}")
        except Exception as failed:  # noqa: BLE001 — a scope that raised: its type only (its text may hold a value)
            return DeclarationError(path, str(name), f"its template does not render: {type(failed).__name__}")
    return DeclarationError(path, "attributes", "a template does not render")


def _template_reason(exc: Exception) -> str:
    """Why a template did not render, in words that hold nothing a variable held: an undefined name, a syntax
    error of the template's own text, or else only the type of the error raised while it was evaluated."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("UndefinedError:"):
            return line.split(", available scope is")[0]
    last = lines[-1] if lines else ""
    kind, _, said = last.partition(": ")
    kind = kind.rsplit(".", 1)[-1]
    if kind == "TemplateSyntaxError":  # about the template's own text
        return f"{kind}: {said}"
    return kind or type(exc).__name__


def from_config_error(path: Path, exc: ConfigError) -> DeclarationError:
    """A ConfigError about a declaration's attribute as the DeclarationError of its file."""
    if isinstance(exc, DeclarationError):
        return exc
    attribute = exc.field or "attributes"
    text = str(exc)
    return DeclarationError(path, attribute, text.removeprefix(f"{attribute}: "))


def _declared_name(path: Path) -> str | None:
    """The `attributes.name` of a file that did not load, if it can be read at all."""
    import yaml

    try:
        check_size(path)
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        name = document["attributes"]["name"]
    except Exception:  # noqa: BLE001 — unreadable: the error names the file anyway
        return None
    return name if isinstance(name, str) else None
