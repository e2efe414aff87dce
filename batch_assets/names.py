"""The names a team's declaration gives, checked one way for a sweep and a queue: the declaration's own name (its
job, lock and queue), and the `module:function` of its compute or handler. Validators of pydantic models: a
refusal is a ValueError whose text follows the attribute's name in the one-line error."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,40}", re.ASCII)
FUNCTION_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*", re.ASCII)


def checked_name(value: str) -> str:
    """`value` when it is a declaration's name, else ValueError saying the rule."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ValueError(f"must match [a-z][a-z0-9_]{{0,40}}, got {value!r}")
    return value


def checked_function(value: str) -> str:
    """`value` (stripped) when it is `module:function` (the function may be `Class.method`), else ValueError."""
    stripped = value.strip() if isinstance(value, str) else value
    if not isinstance(stripped, str) or not FUNCTION_RE.fullmatch(stripped):
        raise ValueError(f"must be module:function, got {value!r}")
    return stripped
