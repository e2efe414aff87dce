"""`RowFailure`: what a declared job's function raises for a row whose own data it cannot use.

Kept free of heavy imports: a team's function imports it (`from batch_assets import RowFailure`).
"""

from __future__ import annotations

import re

KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")
"""A failure kind: a short lower-case word (it becomes a key of `failed_by_type`)."""

COMPUTE_ERROR = "compute_error"
"""Any other exception of a declared compute (or a result that is not exactly the `writes` columns): systemic."""


class RowFailure(Exception):
    """This row's own data cannot be computed: counted under `failed_by_type[kind]`, the row not written
    and, with `due`, left due. `kind` is a short lower-case word, e.g. `RowFailure("missing_points")`."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind
