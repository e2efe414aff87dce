"""docs/reliability.md from a campaign's results: the fault table, bad input, the secret scan."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from faults.campaign import Campaign, FaultResult

INFO_KEYS = {"transitions", "new_triggers", "new_events", "unevaluable", "posts_total", "posts_max_per_key",
             "payments_done", "sink_resends", "subscriptions_expired", "subscriptions_failed", "subscriptions_active"}


def _recovery(results: list[FaultResult]) -> str:
    times = sorted(r.recovery_s for r in results if r.recovery_s is not None)
    if not times:
        return "—"
    if len(times) == 1 or round(times[0]) == round(times[-1]):
        return f"{times[0]:.0f} s"
    return f"{times[0]:.0f}–{times[-1]:.0f} s"


def _outcome(results: list[FaultResult]) -> str:
    counts: OrderedDict[str, int] = OrderedDict()
    for r in results:
        key = f"{r.outcome} ({r.reason})" if r.reason else r.outcome
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} {v}" if len(results) > 1 else k for k, v in counts.items())


def fault_table(results: list[FaultResult]) -> list[str]:
    groups: OrderedDict[str, list[FaultResult]] = OrderedDict()
    for r in results:
        groups.setdefault(r.spec.label, []).append(r)
    lines = ["| fault | runs | outcome | rows lost | duplicates | recovery time |", "|---|---:|---|---:|---:|---:|"]
    for label, rs in groups.items():
        injected = [r for r in rs if r.injected]
        lost = sum(r.report.rows_lost for r in injected)
        dups = sum(r.report.duplicates for r in injected)
        lines.append(f"| {label} | {len(rs)} | {_outcome(rs)} | {lost:,} | {dups:,} | {_recovery(rs)} |")
    return lines


def details(results: list[FaultResult]) -> list[str]:
    lines = []
    for i, r in enumerate(results, 1):
        lines.append(f"{i}. **{r.spec.label}** (at {r.spec.at:.0%}, workers {r.spec.workers}, fault seed {r.seed}): "
                     f"**{r.outcome}**. {r.injected_note}.")
        if r.faulted:
            lines.append(f"   - faulted run: `{r.faulted}`")
        if r.truth_violation:
            lines.append(f"   - untruthful outcome: {r.truth_violation}")
        if r.injected:
            rec = f"{r.recovery_s:.1f} s" if r.recovery_s is not None else "not reached"
            rcs = _rcs(r.recovery_rcs)
            lines.append(f"   - recovery: {r.recovery_runs} run(s){rcs}, SUCCESS after {rec}")
            lines.append(f"   - invariants: {r.report.describe()}")
            shown = {k: v for k, v in r.report.info.items() if k in INFO_KEYS}
            if shown:
                lines.append("   - counters: " + ", ".join(f"{k} {v:,}" for k, v in sorted(shown.items())))
        for note in r.notes:
            lines.append(f"   - {note}")
        if r.error:
            lines.append(f"   - campaign error: {r.error}")
    return lines


def _rcs(codes: list[int]) -> str:
    """Exit codes of the recovery runs, run-length encoded: ` (exit 75 ×6, 0)`."""
    if not codes:
        return ""
    parts: list[str] = []
    for code in codes:
        if parts and parts[-1].split(" ×")[0] == str(code):
            n = int(parts[-1].split(" ×")[1]) + 1 if " ×" in parts[-1] else 2
            parts[-1] = f"{code} ×{n}"
        else:
            parts.append(str(code))
    return " (exit " + ", ".join(parts) + ")"


def fuzz_lines(rows: list[dict[str, Any]], *, cli: bool) -> list[str]:
    bad = [r for r in rows if not r["ok"]]
    lines = [f"{len(rows) - len(bad)} of {len(rows)} refused as required."]
    if cli:
        lines += ["", "| input | exit | stderr | written | verdict |", "|---|---:|---|---|---|"]
        for r in rows:
            verdict = "ok" if r["ok"] else "**" + ", ".join(r["problems"]) + "**"
            stderr = r["stderr"].replace("|", "\\|").replace("`", "'")
            lines.append(f"| `{r['case']}` | {r['rc']} | {stderr} | {'yes' if r['written'] else 'no'} | {verdict} |")
    elif bad:
        lines += ["", "Accepted or crashed:", ""]
        lines += [f"- `{r['case']}`: {', '.join(r['problems'])}" for r in bad]
    return lines


def render(c: Campaign, *, command: str, duration_s: float, failed: bool) -> str:
    results = c.results
    injected = [r for r in results if r.injected]
    passed = sum(1 for r in results if r.outcome == "pass")
    out = [
        "# Reliability: the fault campaign",
        "",
        "Written by `make faults` (`python -m faults`); do not edit by hand. The campaign owns a PostgreSQL",
        "server (initdb + pg_ctl in a temp dir), a Redis and a limits-service stub, drives the product only",
        "through `batch-assets` processes, injects each fault at a seeded point of a real run (progress-based:",
        "it polls the rows written), then runs the same command again until it ends SUCCESS (exit 75 = wait for",
        "the lock) and checks invariants with code of its own (faults/checker.py decrypts per CONTRACT §4 and",
        "computes the rule per CONTRACT §5; it does not import the engine):",
        "",
        "- every ACTIVE row equals the rule for the run date; a row that cannot be evaluated stays due;",
        "- one review trigger and one outbox event per transition, none without one;",
        "- every payment DONE, written DONE once, at most 2 accepted POSTs per Idempotency-Key;",
        "- subscriptions all-or-nothing (EXPIRED ⇒ no enrollments; ACTIVE/FAILED ⇒ all of them);",
        "- every outbox event SENT and in the sink;",
        "- truthfulness: a run that ended SUCCESS left no row in scope uncomputed beyond its `failed` count.",
        "",
        f"- command: `{command}`",
        f"- seed: `{c.seed}`; run date {c.run_date}; {c.sizes.customers:,} customers, "
        f"{c.sizes.subscriptions:,} subscriptions, {c.sizes.payments:,} payments per fault",
        f"- PostgreSQL binaries: `{c.pg.bindir}`; Redis: {'yes' if c.redis else 'absent (lock-store faults skipped)'}",
        f"- {len(results)} faults planned, {len(injected)} injected, {passed} passed; "
        f"campaign took {duration_s / 60:.1f} min; result: **{'FAIL' if failed else 'PASS'}**",
        "",
        "## Faults",
        "",
        "`rows lost` counts rows left wrong or uncomputed after recovery, missing triggers/events, payments",
        "not DONE, subscriptions left half-expired or not expired, events not sent. `duplicates` counts extra",
        "triggers/events, payments written DONE twice or POSTed (accepted) more than twice. `recovery time` is",
        "from the fault to the end of the first SUCCESS run. \"not injected\" means the run ended before the",
        "fault point: it is not a pass.",
        "",
        *fault_table(results),
        "",
        "### Each fault",
        "",
        *details(results),
        "",
        "## Bad input",
        "",
        "Every command and flag with bad values (dates, thresholds, knobs, URLs, key): each must exit 2 with",
        "one line on stderr and write nothing (a checksum of every table before and after).",
        "",
        *fuzz_lines(c.fuzz, cli=True),
        "",
        "Every field of every run-config class (what the Dagster launchpad accepts), built with bad values:",
        "",
        *fuzz_lines(c.config_fuzz, cli=False),
        "",
        "## Secret scan",
        "",
        f"The encryption key, the database password (the campaign's server has a password-authenticated role) and "
        f"{len(c.dobs):,} distinct decrypted dates of birth (those before {c.run_date.year - 1}: younger ones "
        f"collide with run dates and timestamps) were searched in the stdout/stderr of "
        f"{c.secrets.get('cli_outputs_scanned', 0)} commands, {c.secrets.get('home_files_scanned', 0)} files under "
        f"BATCH_ASSETS_HOME (the Dagster instance: SQLite run and event-log storage, logs; the relay's sink "
        f"files), {c.secrets.get('outbox_payloads_scanned', 0):,} outbox payloads and the limits-service requests.",
        "",
    ]
    hits = c.secrets.get("hits", [])
    out += ([f"- **found**: {h}" for h in hits] if hits else ["Nothing found."])
    if c.skipped:
        out += ["", "## Skipped", ""] + [f"- {s}" for s in c.skipped]
    return "\n".join(out) + "\n"
