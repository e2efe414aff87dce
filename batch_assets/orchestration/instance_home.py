"""The Dagster instance directory of batch_assets and its dagster.yaml, without importing Dagster.

Every `batch-assets` command (CONTRACT §1 DAGSTER_HOME, README "Running it in production") calls
`write_instance_config` first, so that following the README literally (`db migrate` in a fresh
DAGSTER_HOME) leaves the instance file the webserver and the daemon then read: PostgreSQL storage
when BATCH_ASSETS_DAGSTER_PG_URL is set, the run limits, run monitoring, telemetry and the
onboarding dialog off. Kept free of Dagster so `rules show` or `queue stats` stay quick.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from batch_assets.errors import ConfigError
from batch_assets.settings import DAGSTER_PG_URL_VAR, Settings

SQLITE_TEMPLATE = "dagster.yaml"
POSTGRES_TEMPLATE = "dagster.postgres.yaml"


def repo_root() -> Path:
    """The repository (the package is installed editable): where workspace.yaml and dagster*.yaml live."""
    return Path(__file__).resolve().parents[2]  # .../batch_assets/orchestration/instance_home.py; not via
    # `import batch_assets`, whose __init__ imports a domain (this module sits below the domains' layer)


def write_instance_config(settings: Settings) -> Path:
    """The Dagster instance directory, given our dagster.yaml when it has none; sets DAGSTER_HOME for this process.

    The file is written when missing, or switched when it is our other template verbatim (the storage
    choice changed); a dagster.yaml someone edited is left alone. A directory that cannot be written is
    a ConfigError naming DAGSTER_HOME.
    """
    configured = os.environ.get("DAGSTER_HOME", "").strip()
    home = Path(configured).expanduser().resolve() if configured else settings.dagster_home
    wanted = POSTGRES_TEMPLATE if os.environ.get(DAGSTER_PG_URL_VAR, "").strip() else SQLITE_TEMPLATE
    other = SQLITE_TEMPLATE if wanted == POSTGRES_TEMPLATE else POSTGRES_TEMPLATE
    target = home / "dagster.yaml"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_bytes() == (repo_root() / other).read_bytes():
            shutil.copyfile(repo_root() / wanted, target)
    except OSError as exc:
        raise ConfigError(f"cannot write the Dagster instance file {target}: {exc.strerror}",
                          field="DAGSTER_HOME") from None
    os.environ["DAGSTER_HOME"] = str(home)
    return home
