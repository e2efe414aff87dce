"""What a sweep's failure kinds may be, and the kinds of a `compute` that broke or did not return."""

from __future__ import annotations

import re

KIND_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")
"""A failure kind: a short lower-case word (it becomes a key of `failed_by_type`)."""

COMPUTE_ERROR = "compute_error"
"""Any other exception of a declared compute (or a result that is not exactly the `writes` columns): systemic."""

COMPUTE_TIMEOUT = "compute_timeout"
"""A compute call that outlasted its bound (`Sweep.call_timeout_s`): the row is not written; systemic, like
compute_error."""
