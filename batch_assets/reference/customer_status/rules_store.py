"""Age-category rules in `ba_rules`: one row per version, the current one is the highest.

An empty table means DEFAULT_RULES (version 0).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import sqlalchemy as sa

from batch_assets import ConfigError
from batch_assets.reference.customer_status import sql
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, Rules


def _rules_of(stored: object) -> Rules:
    if isinstance(stored, str):
        stored = json.loads(stored)
    if not isinstance(stored, list) or not all(isinstance(p, list) and len(p) == 2 for p in stored):
        raise ConfigError("stored rules are not a list of [category, min_age]", field="thresholds")
    return Rules.from_pairs([(p[0], p[1]) for p in stored])


def current_rules(conn: sa.Connection) -> tuple[int, Rules]:
    """(version, rules) in force; (0, DEFAULT_RULES) when none were ever set."""
    row = conn.execute(sql.CURRENT_RULES).first()
    if row is None:
        return 0, DEFAULT_RULES
    return int(row[0]), _rules_of(row[1])


def rules_in_force(engine: sa.Engine) -> Rules:
    """The rules in force, read on a connection of its own."""
    with engine.connect() as conn:
        return current_rules(conn)[1]


def previous_rules(conn: sa.Connection) -> Rules | None:
    """The rules before the current version (DEFAULT_RULES before the first stored one); None if never changed."""
    rows = conn.execute(sql.CURRENT_RULES).first()
    if rows is None:
        return None
    previous = conn.execute(sql.PREVIOUS_RULES).first()
    if previous is None:
        first = _rules_of(rows[1])
        return None if first.fingerprint == DEFAULT_RULES.fingerprint else DEFAULT_RULES
    return _rules_of(previous[1])


def settled_rules(conn: sa.Connection) -> Rules | None:
    """The old rules for the config-change pre-check, or None when they are ambiguous.

    The pre-check may skip a row only if that row was settled under the previous rules (or is
    already settled under the current ones). That holds when at most one rules change happened
    since the last successful full or config-change sweep; after two or more (A -> B -> C with no
    sweep between), rows may still carry A's dates, so every row is evaluated instead.
    """
    changes = int(conn.execute(sql.RULE_CHANGES_SINCE_LAST_SETTLE).scalar_one())
    if changes > 1:
        return None
    return previous_rules(conn)


def set_rules(engine: sa.Engine, rules: Rules) -> int:
    """Store `rules` as the new current version and return it; a no-op returning the current
    version when the fingerprint equals the current one."""
    return change_rules(engine, lambda _current: rules)[0]


def change_rules(engine: sa.Engine, change: Callable[[Rules], Rules]) -> tuple[int, Rules, Rules]:
    """Store `change(current rules)` as the new current version: (version, rules before, rules now).

    `change` runs under the rules lock on the rules in force, so two concurrent merges (`rules set
    --thresholds YOUNG_ADULT=21` and `... ADULT=30`) both land; a ConfigError from it writes nothing.
    Equal fingerprints store nothing and return the current version."""
    with engine.begin() as conn:
        conn.execute(sql.LOCK_RULES)
        version, current = current_rules(conn)
        rules = change(current)
        if current.fingerprint == rules.fingerprint:
            return version, current, current
        row = conn.execute(
            sql.INSERT_RULES, {"rules": json.dumps(rules.to_json()), "fingerprint": rules.fingerprint}
        ).one()
        return int(row[0]), current, rules
