"""The bench checker's judgement of the sections beside the sweep: start-up and the CLI against the references,
the payment queue (with its rate limit) and the outbox."""

from __future__ import annotations

from typing import Any

from batch_assets.bench.checker import Checker, close

QUEUE_KEYS = ("payments", "worker_processes", "product_per_s", "floor_per_s", "ratio", "pickup_latency_ms",
              "http_stub")


def check_startup(c: Checker, report: dict[str, Any]) -> None:
    startup = c.section(report, "startup")
    if not startup:
        return
    _check_startup_runs(c, startup, "startup")
    launcher = startup.get("launcher")  # a report made before the resident launcher (cli/launcher.py) has none
    if isinstance(launcher, dict):
        _check_startup_runs(c, launcher, "startup.launcher")
    _check_cli_wall(c, startup)


def _check_startup_runs(c: Checker, startup: dict[str, Any], where: str) -> None:
    """Each probe's start-up is its wall minus its duration_s; the figure is a probe's and its goal follows it."""
    runs = startup.get("runs") or []
    c.that(len(runs) >= 1, f"{where}.runs is empty")
    for i, run in enumerate(runs):
        c.that(run.get("cli_wall_s", 0) > run.get("engine_duration_s", 0) >= 0,
               f"{where}.runs[{i}]: the CLI wall time must exceed the engine's duration_s")
        c.that(close(run.get("startup_s", -1), run.get("cli_wall_s", 0) - run.get("engine_duration_s", 0)),
               f"{where}.runs[{i}].startup_s is not cli_wall_s - engine_duration_s")
    if c.positive(startup, "startup_s", where):
        figures = [r.get("startup_s", 0) for r in runs] or [0]
        c.that(min(figures) <= startup["startup_s"] <= max(figures), f"{where}.startup_s is not within its runs'")
        if "within_goal" in startup:
            c.that(startup["within_goal"] is (startup["startup_s"] <= 1.0), f"{where}.within_goal does not follow "
                   "its figure (goal: at most 1.0 s)")


def _check_cli_wall(c: Checker, startup: dict[str, Any]) -> None:
    """The CLI against the references: a steady-state full sweep writes nothing and its ratio is its wall
    over the floor's time; the queue probe settled every payment and its ratio is its wall rate over the floor's.
    The goals themselves are reported (`within_goal`), held to their figures, not required."""
    for i, probe in enumerate(startup.get("cli_steady_state") or []):
        where = f"startup.cli_steady_state[{i}]"
        if c.positive(probe, "cli_wall_s", where) and c.positive(probe, "floor_s", where):
            c.that(close(probe.get("cli_wall_over_floor", -1), probe["cli_wall_s"] / probe["floor_s"]),
                   f"{where}.cli_wall_over_floor is not cli_wall_s / floor_s")
            c.that(probe.get("within_goal") is (probe["cli_wall_s"] / probe["floor_s"] <= 1.0 + 0.005),
                   f"{where}.within_goal does not follow its ratio")
        c.that(probe.get("changed") == 0, f"{where}: a steady-state sweep changed {probe.get('changed')} rows")
        c.that(probe.get("cli_wall_s", 0) > probe.get("engine_duration_s", 0) > 0,
               f"{where}: the CLI wall time must exceed the engine's duration_s")
    for key in ("cli_queue", "cli_queue_launcher", "cli_queue_launcher_seeded"):
        _check_cli_queue(c, startup.get(key), f"startup.{key}")


def _check_cli_queue(c: Checker, queue: dict[str, Any] | None, where: str) -> None:
    if queue:
        c.that(queue.get("done") == queue.get("payments"), f"{where}: {queue.get('done')} of "
               f"{queue.get('payments')} payments DONE")
        if c.positive(queue, "cli_wall_per_s", where) and c.positive(queue, "floor_per_s", where):
            c.that(close(queue.get("cli_wall_over_floor", -1), queue["cli_wall_per_s"] / queue["floor_per_s"]),
                   f"{where}.cli_wall_over_floor is not cli_wall_per_s / floor_per_s")
            c.that(close(queue["cli_wall_per_s"], queue["payments"] / queue.get("cli_wall_s", 1)),
                   f"{where}.cli_wall_per_s is not payments / cli_wall_s")
        c.that(queue.get("cli_wall_s", 0) >= queue.get("own_clock_s", 0) > 0,
               f"{where}: the wall time must cover each worker's own clock")
        if "rows" in queue:  # reports before the probes named their rows judged every probe
            judged = queue["rows"] == "floor"
            c.that((queue.get("within_goal") is None) is not judged,
                   f"{where}.within_goal: judged only on the floor's rows, got {queue.get('within_goal')!r} "
                   f"for rows {queue['rows']!r}")
            if judged and isinstance(queue.get("cli_wall_over_floor"), (int, float)):
                c.that(queue.get("within_goal") is (queue["cli_wall_over_floor"] >= 0.6 - 0.0005),
                       f"{where}.within_goal does not follow its ratio")


def check_queue(c: Checker, report: dict[str, Any], allow_missing: tuple[str, ...]) -> None:
    q = report.get("queue")
    if not isinstance(q, dict) or q.get("status") != "measured":
        reason = (q or {}).get("reason", "no queue section") if isinstance(q, dict) else "no queue section"
        c.that("queue" in allow_missing, f"queue: not measured ({reason})")
        return
    for key in QUEUE_KEYS:
        c.that(key in q, f"queue.{key} is missing")
    if any(key not in q for key in QUEUE_KEYS):
        return
    for key in ("payments", "product_per_s", "floor_per_s", "ratio"):
        c.positive(q, key, "queue")
    c.that(q.get("worker_processes") == 2, f"queue.worker_processes must be 2, got {q.get('worker_processes')}")
    if q.get("floor_per_s"):
        c.that(close(q.get("ratio", -1), q.get("product_per_s", 0) / q["floor_per_s"], 0.05),
               "queue.ratio is not product_per_s / floor_per_s")
    lat = q.get("pickup_latency_ms") or {}
    c.that(lat.get("samples", 0) > 0, "queue.pickup_latency_ms.samples must be positive")
    c.that(0 <= lat.get("p50", -1) <= lat.get("p99", -1), "queue.pickup_latency_ms needs 0 <= p50 <= p99")
    stub = q.get("http_stub") or {}
    for key in ("latency_ms", "concurrency", "payments", "per_s", "target_per_s"):
        c.positive(stub, key, "queue.http_stub")
    check_rate_limit(c, q.get("rate_limit"))


def check_rate_limit(c: Checker, rl: Any) -> None:
    """queue.rate_limit when the report has it: calls made, windows consistent with the limit, a cost."""
    if rl is None:
        return
    if not isinstance(rl, dict):
        c.that(False, "queue.rate_limit must be an object")
        return
    for key in ("limit_per_s", "calls", "achieved_per_s"):
        c.positive(rl, key, "queue.rate_limit")
    w = rl.get("window_1s") or {}
    c.that(0 < w.get("min", 0) <= w.get("max", -1), "queue.rate_limit.window_1s needs 0 < min <= max")
    if rl.get("limit_per_s"):
        c.that(close(w.get("max_ratio", -1), w.get("max", 0) / rl["limit_per_s"], 0.01),
               "queue.rate_limit.window_1s.max_ratio is not max / limit_per_s")
    cost = rl.get("cost") or {}
    for key in ("payments", "unlimited_per_s", "limit_far_above_per_s", "ratio"):
        c.positive(cost, key, "queue.rate_limit.cost")


def check_outbox(c: Checker, report: dict[str, Any]) -> None:
    """The outbox section when the report has one (older reports have none): each broker measured
    with positive rates and ratio = relay / raw, or not measured with a reason."""
    o = report.get("outbox")
    if o is None:
        return
    if not c.that(isinstance(o, dict) and o.get("status") == "measured", "outbox.status must be measured"):
        return
    c.positive(o, "events", "outbox")
    c.positive(o, "batch_size", "outbox")
    brokers = o.get("brokers")
    if not c.that(isinstance(brokers, dict) and bool(brokers), "outbox.brokers is missing"):
        return
    _check_drain(c, o.get("drain"), report.get("rows", 0))
    for name, entry in brokers.items():
        where = f"outbox.brokers.{name}"
        if entry.get("status") != "measured":
            c.that(bool(entry.get("reason")), f"{where}: not measured without a reason")
            continue
        ok = all([c.positive(entry, key, where) for key in ("relay_per_s", "raw_per_s", "ratio")])
        if ok:
            c.that(close(entry["ratio"], entry["relay_per_s"] / entry["raw_per_s"], 0.05),
                   f"{where}.ratio is not relay_per_s / raw_per_s")


def _check_drain(c: Checker, d: Any, rows: int) -> None:
    """The drain of a first computation's events, in reports that have it: every event SENT, the
    backlog empty no sooner than the sweep ended, a peak within the events."""
    if d is None:
        return
    if not c.that(isinstance(d, dict), "outbox.drain must be an object"):
        return
    if d.get("status") != "measured":
        c.that(bool(d.get("reason")), "outbox.drain: not measured without a reason")
        return
    c.that(d.get("rows") == min(rows, 1_000_000), f"outbox.drain.rows is {d.get('rows')}, not min(rows, 1M)")
    c.that(d.get("events") == d.get("rows") == d.get("sent"),
           f"outbox.drain: a first computation of {d.get('rows')} rows must make and send as many events, got "
           f"events={d.get('events')} sent={d.get('sent')}")
    for key in ("sweep_s", "drained_s", "events_per_s"):
        c.positive(d, key, "outbox.drain")
    c.that(d.get("drained_s", 0) >= d.get("sweep_s", 0), "outbox.drain.drained_s is shorter than the sweep")
    c.that(0 <= d.get("peak_backlog", -1) <= d.get("events", 0), "outbox.drain.peak_backlog must be in 0..events")
