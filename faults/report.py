"""docs/reliability.md from a campaign's results: the fault table, bad input, the secret scan."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from faults import checker
from faults.campaign import EDIT_RATE, Campaign, FaultResult
from faults.hosts import render_scenario
from faults.product import tested_tree

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
        groups.setdefault(r.spec.group, []).append(r)
    lines = ["| fault | runs | outcome | rows lost | stale | duplicates | recovery time |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for label, rs in groups.items():
        injected = [r for r in rs if r.injected]
        lost = sum(r.report.rows_lost for r in injected)
        stale = sum(r.report.stale for r in injected)
        dups = sum(r.report.duplicates for r in injected)
        lines.append(f"| {label} | {len(rs)} | {_outcome(rs)} | {lost:,} | {stale:,} | {dups:,} | {_recovery(rs)} |")
    return lines


def hostile_table(results: list[FaultResult]) -> list[str]:
    """One line per hostile row kind: what the rule or the queue says it becomes, what each fault saw."""
    kinds: OrderedDict[tuple[str, str], list[tuple[FaultResult, checker.HostileOutcome]]] = OrderedDict()
    for r in results:
        family = "payment" if r.spec.job == "queue" else "customer"
        for kind, outcome in r.hostile.items():
            kinds.setdefault((family, kind), []).append((r, outcome))
    if not kinds:
        return ["No hostile-row fault ran."]
    lines = ["| row | kind | expected outcome | observed (counted as / row state after) | faults | verdict |",
             "|---|---|---|---|---:|---|"]
    for (family, kind), seen in kinds.items():
        observed: list[str] = []
        for _, o in seen:
            observed += [t for t in o.observed if t not in observed]
        verdict = "pass" if all(o.ok for _, o in seen) else "**FAIL**"
        text = "; ".join(observed).replace("|", "\\|")
        shown = kind.replace("|", "\\|")
        lines.append(f"| {family} | {shown} | {EXPECTED.get(seen[0][1].expected, seen[0][1].expected)} | {text} | "
                     f"{len(seen)} | {verdict} |")
    return lines


def declarations_table(results: list[FaultResult]) -> list[str]:
    """One line per hostile declaration: what the author wrote, the outcome expected, each command's."""
    ran = [r for r in results if r.declaration is not None]
    if not ran:
        return ["No hostile declaration ran in this campaign."]
    lines = ["| declaration (what the author wrote) | job | expected | observed (then the valid declaration) | "
             "wrong rows | leaks | verdict |", "|---|---|---|---|---:|---:|---|"]
    for r in ran:
        d = r.declaration
        assert d is not None
        wrong = sum(n for k, n in r.report.violations.items() if k in checker.TEAM_ROW_KINDS)
        leaks = r.report.violations.get("canary_leak", 0)
        if r.outcome == "known failure":
            verdict = f"**known failure**: {d.known}"
        elif r.outcome == "pass":
            verdict = "pass"
        else:
            verdict = f"**{r.outcome}**" + (f": {r.report.describe()[:300]}" if not r.report.ok else "")
        then = "SUCCESS" if r.recovered else "**no SUCCESS**"
        cells = [d.title, d.component, d.expected, "; ".join(d.observed) + f" (then: {then})", f"{wrong:,}",
                 f"{leaks:,}", verdict]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


EXPECTED = {
    "missing_data": "counted as `missing_data`; category kept, left due",
    "invalid_value": "counted as `invalid_value`; category kept, left due",
    "decrypt_failure": "counted as `decrypt_failure`; category kept, left due",
    "computed": "computed by the rule (not a failure)",
    "DONE": "DONE (or FAILED with a true `last_error`), never lost",
}


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
        bad = [f"{k}: {'; '.join(o.observed)}" for k, o in r.hostile.items() if not o.ok]
        if r.hostile:
            lines.append(f"   - hostile rows: {len(r.hostile) - len(bad)} of {len(r.hostile)} kinds as expected"
                         + (f"; not: {' | '.join(bad)}" if bad else ""))
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


def hosts_section(c: Campaign) -> list[str]:
    """The several-hosts fault (faults/hosts.py): its timelines and checks; docs/hosts.md is the rig's own report."""
    out = ["## Several hosts", "",
           "A host lost in the middle of a range, and queue workers on several hosts: three test hosts (network, pid",
           "and uts namespaces), one killed with `kill -9` of every process. [docs/hosts.md](hosts.md) is the same",
           "rig's own report (`make hosts`), with the commit it ran on.", ""]
    if not c.hosts:
        return out + ["Not run in this campaign (quick, filtered out, or the machine cannot host namespaces)."]
    for sc in c.hosts:
        out += render_scenario(sc, level=3)
    return out


def render(c: Campaign, *, command: str, duration_s: float, failed: bool) -> str:
    results = c.results
    injected = [r for r in results if r.injected]
    passed = sum(1 for r in results if r.outcome == "pass")
    known = sum(1 for r in results if r.outcome == "known failure")
    out = [
        "# Reliability: the fault campaign",
        "",
        "Written by `make faults` (`python -m faults`); do not edit by hand. The campaign owns a PostgreSQL",
        "server (initdb + pg_ctl in a temp dir), a Redis and a limits-service stub, drives the product only",
        "through `batch-assets` processes, injects each fault at a seeded point of a real run (progress-based:",
        "it polls the rows written), then runs the same command again until it ends SUCCESS (exit 75 = wait for",
        "the lock) and checks invariants with code of its own (faults/checker.py decrypts the dates of birth and",
        "computes the rule itself; it does not import the engine):",
        "",
        "- every ACTIVE row equals the rule for the run date; a row that cannot be evaluated stays due;",
        "- no row stale after another service edited it during a run; each write the rule of what the row held;",
        "- every hostile row gets its named outcome (the table under \"Writers beside the jobs\");",
        "- one review trigger and one outbox event per transition, none without one;",
        "- every payment DONE, written DONE once, at most 2 accepted POSTs per Idempotency-Key;",
        "- subscriptions all-or-nothing (EXPIRED ⇒ no enrollments; ACTIVE/FAILED ⇒ all of them);",
        "- every outbox event SENT and in the sink; with a broker (RabbitMQ, NATS JetStream) every message carries",
        "  its own event id (message_id / Nats-Msg-Id), duplicates counted, none lost;",
        "- truthfulness: a run that ended SUCCESS left no row in scope uncomputed beyond its `failed` count.",
        "",
        f"- command: `{command}`; tree: {tested_tree()}",
        f"- seed: `{c.seed}`; run date {c.run_date}; {c.sizes.customers:,} customers, "
        f"{c.sizes.subscriptions:,} subscriptions, {c.sizes.payments:,} payments per fault",
        f"- PostgreSQL binaries: `{c.pg.bindir}`; Redis: {'yes' if c.redis else 'absent (lock-store faults skipped)'}"
        f"; brokers: {', '.join(c.brokers()) or 'none (broker faults skipped)'}",
        f"- {len(results)} faults planned, {len(injected)} injected, {passed} passed"
        f"{f', {known} known failure(s) (reported below)' if known else ''}; rows lost "
        f"{sum(r.report.rows_lost for r in injected):,}, stale {sum(r.report.stale for r in injected):,}, "
        f"duplicates {sum(r.report.duplicates for r in injected):,}; "
        f"campaign took {duration_s / 60:.1f} min; result: **{'FAIL' if failed else 'PASS'}**",
        "",
        "## Faults",
        "",
        "`rows lost` counts rows left wrong or uncomputed after recovery, missing triggers/events, payments",
        "not DONE, subscriptions left half-expired or not expired, events not sent. `duplicates` counts extra",
        "triggers/events, payments written DONE twice or POSTed (accepted) more than twice. `stale` counts rows",
        "holding, not due, the result of a date of birth they no longer had (below). `recovery time` is",
        "from the fault to the end of the first SUCCESS run. \"not injected\" means the run ended before the",
        "fault point: it is not a pass.",
        "",
        *fault_table(results),
        "",
        "## Hostile declarations",
        "",
        "Each case is the campaign's valid declaration (a sweep over a team table `accounts`, 240 OPEN rows, 20",
        "CLOSED and one whose status is the encryption key's text; or a queue over `team_jobs`) changed in one way,",
        "under `BATCH_ASSETS_DEFS_DIR`, and the CLI run against it as an operator would: `db migrate`, `jobs list`,",
        "then `jobs run NAME --set mode=full` (a sweep) or `queue work --queue NAME --drain` (a queue)",
        "(faults/declarations.py). A declaration that cannot work must get exit 2 and one stderr line naming the",
        "file and the attribute from every command that would act on it, and nothing written: a digest of every",
        "table, column, index and trigger is taken before and after each command. A row-level case must run: its",
        "hostile rows (10 %) counted under the named kind and left as they were, every other row the team's rule",
        "(computed by faults/checker.py), a SUCCESS counting exactly the hostile rows. `wrong rows` counts rows",
        "written that must not be, written wrong or left uncomputed, and anything a refused command wrote. `leaks`",
        "counts the places a canary was found: every row's `code` and 9-digit `points` (both `sensitive`) and the",
        "encryption key, searched in every command's stdout and stderr, every `ba_` table and the outbox, and every",
        "file of the Dagster instance the case changed (run and event-log storage row by row, compute logs, step",
        "outputs). Then the valid declaration takes its place and must succeed over the same table.",
        "",
        *declarations_table(results),
        "",
        "## Writers beside the jobs",
        "",
        f"The concurrent writer made {sum(r.edits for r in results):,} edits of `encrypted_dob` while sweeps ran",
        f"(about {EDIT_RATE} a second, on a connection of its own, each a valid ciphertext of another date). A row",
        "is `stale` when it is not due and holds the category and `next_review_date` of a date of birth it no longer",
        "has, or when a write of the product was computed from one (the campaign's trigger logs the ciphertext each",
        "written row held). After the run and one delta every row must be the rule applied to its current date of",
        "birth, and the review triggers and outbox events must be exactly those of the transitions written.",
        "",
        "Hostile rows are written by another connection while a run works; for customers, each kind as a new row,",
        "over a settled row (its category kept, `next_review_date` cleared by the trigger) and, in full and",
        "config-change sweeps, as a new row holding a category and a future `next_review_date`. The counts are",
        "the settling run's `failed_by_type` against the checker's own count over the rows it read; where they",
        "differ, each suspect kind is swept alone to name what it was counted as. Payments are judged as the drain",
        "left them, before the campaign fast-forwards time or replays the DLQ.",
        "",
        *hostile_table(results),
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
    out += ["", *hosts_section(c)]
    if c.skipped:
        out += ["", "## Skipped", ""] + [f"- {s}" for s in c.skipped]
    return "\n".join(out) + "\n"
