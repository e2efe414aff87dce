"""Checker: collects the problems of a bench report as readable one-line messages (bench/check.py and
bench/check_services.py judge the sections with it)."""

from __future__ import annotations

import math
from typing import Any


class Checker:
    """Collects problems as readable one-line messages."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def that(self, condition: bool, message: str) -> bool:
        if not condition:
            self.problems.append(message)
        return condition

    def positive(self, entry: dict[str, Any], key: str, where: str) -> bool:
        value = entry.get(key)
        return self.that(isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
                         f"{where}.{key} must be a positive number, got {value!r}")

    def section(self, report: dict[str, Any], key: str, where: str = "report") -> dict[str, Any]:
        value = report.get(key)
        if isinstance(value, dict) and value:
            return value
        self.that(False, f"{where}.{key} is missing")
        return {}


def close(a: float, b: float, tolerance: float = 0.02) -> bool:
    """Equal up to the rounding of the report's figures."""
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=0.01)
