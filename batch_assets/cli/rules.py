"""`batch-assets rules show | set`: the age-category rules."""

from __future__ import annotations

import argparse
from typing import Any

from batch_assets.cli.output import emit, err
from batch_assets.db.engine import connected_engine
from batch_assets.errors import (
    EXIT_OK,
)
from batch_assets.settings import Settings


def cmd_rules_show(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.reference.customer_status.rules_store import current_rules

    with connected_engine(settings).connect() as conn:
        version, rules = current_rules(conn)
    err(str(rules))
    emit({"status": "SUCCESS", "version": version, "fingerprint": rules.fingerprint,
          "rules": [{"category": r.category, "min_age": r.min_age} for r in rules.rules]})
    return EXIT_OK


def cmd_rules_set(args: argparse.Namespace, settings: Settings) -> int:
    from batch_assets.reference.customer_status.rules import Rules, parse_pairs
    from batch_assets.reference.customer_status.rules_store import change_rules

    parse_pairs(args.thresholds)  # malformed text: exit 2 before connecting
    if args.replace:
        whole = Rules.parse(args.thresholds)
        version, before, current = change_rules(connected_engine(settings), lambda _current: whole)
    else:  # merged onto the rules in force, under the rules lock
        version, before, current = change_rules(
            connected_engine(settings), lambda rules: rules.merged(args.thresholds))
    changes = current.changes_from(before)
    err(f"rules version {version}: {current} ({changes}; fingerprint {current.fingerprint}); "
        "run `sweep customer-status --mode config-change` (the rules_changed_sensor does it on the daemon)")
    emit({"status": "SUCCESS", "version": version, "fingerprint": current.fingerprint, "rules": str(current),
          "changes": changes})
    return EXIT_OK


def register(sub: Any) -> None:
    """rules show | set"""
    rules = sub.add_parser("rules", help="the age-category rules").add_subparsers(dest="rules_command", required=True)
    rules.add_parser("show").set_defaults(func=cmd_rules_show)
    rs = rules.add_parser("set")
    rs.add_argument("--thresholds", required=True,
                    help="NAME=AGE,... youngest first, merged onto the rules in force: a category named gets the "
                    "new age, the others keep theirs, a new name is added where its age falls "
                    "(e.g. YOUNG_ADULT=21)")
    rs.add_argument("--replace", action="store_true",
                    help="take --thresholds as the whole new list (to remove or rename categories), "
                    "e.g. MINOR=0,YOUNG_ADULT=18,ADULT=26")
    rs.set_defaults(func=cmd_rules_set)
