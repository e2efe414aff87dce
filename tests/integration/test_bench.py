"""`batch-assets bench`: the report, its references, its renderer and its checker, on a real PostgreSQL."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import kill_session

from batch_assets.bench import check, outputs, plans, queue, references, render
from batch_assets.bench.scratch import scratch_prefix_of
from batch_assets.reference.customer_status.rules import DEFAULT_RULES, evaluate, parse_dob
from batch_assets.reference.customer_status.seed import seed_customers
from batch_assets.settings import environ_without_product

pytestmark = [pytest.mark.integration]

ROWS, SMALL_ROWS, NAIVE_SAMPLE = 10_000, 2_000, 500
RUN_DATE = date(2026, 6, 15)


def _bench_env(server_url: str, home: Path) -> dict[str, str]:
    env = environ_without_product()
    # The bench creates its scratch databases next to this one and never writes to it.
    env.update(BATCH_ASSETS_DATABASE_URL=server_url, BATCH_ASSETS_HOME=str(home))
    return env


def _scratch_databases(server_url: str, pid: int) -> set[str]:
    """The scratch databases on the server now of the bench that ran as process `pid` (another test process's
    bench has its own, named after its own process)."""
    engine = sa.create_engine(server_url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        names = conn.execute(sa.text("SELECT datname FROM pg_database WHERE starts_with(datname, :prefix)"),
                             {"prefix": scratch_prefix_of(pid)}).scalars()
        left = set(names)
    engine.dispose()
    return left


@pytest.fixture(scope="module")
def bench_run(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One small --quick bench run for the whole module: its report, output folder, stdout and stderr."""
    out = tmp_path_factory.mktemp("bench")
    bench = subprocess.Popen(
        [sys.executable, "-m", "batch_assets.cli", "bench", "--quick", "--rows", str(ROWS),
         "--small-rows", str(SMALL_ROWS), "--naive-sample", str(NAIVE_SAMPLE), "--queue-payments", "200",
         "--run-date", RUN_DATE.isoformat(), "--output-dir", str(out)],
        env=_bench_env(server_url, out / "home"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = bench.communicate(timeout=900)
    finally:
        kill_session(bench)
    assert bench.returncode == 0, stderr[-3000:]
    return {"dir": out, "report": json.loads((out / "latest.json").read_text()), "stdout": stdout,
            "stderr": stderr, "pid": bench.pid}


def _checker(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "batch_assets.bench.check", str(path), *extra],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_quick_bench_writes_a_complete_report_table_and_charts(bench_run: dict[str, Any], server_url: str) -> None:
    """A --quick run measures every section, prints progress, writes JSON + table + PNGs and drops its databases."""
    report, out = bench_run["report"], bench_run["dir"]
    assert json.loads(bench_run["stdout"].strip().splitlines()[-1]) == report
    assert (out / f"bench-{report['created_at'][:10]}-quick.json").is_file()
    for name in ("latest.md", "throughput.png", "rss.png", "queue.png"):
        assert (out / name).stat().st_size > 0
    assert "(1/11) seeding" in bench_run["stderr"] and "(11/11) peak RSS" in bench_run["stderr"]
    assert "done in" in bench_run["stderr"] and "only" not in report and "--only" not in report["command"]
    sweep = report["sweep"]
    assert sweep["full_first_computation_w1"]["changed"] == ROWS
    assert sweep["full_steady_state_w4"]["changed"] == 0
    assert sweep["delta_500_due"]["changed"] == 500
    for w in (1, 4):  # a delta with 0.1% due at every size, with each worker count
        assert sweep[f"delta_0_1pct_due_w{w}"]["changed"] == sweep[f"delta_0_1pct_due_w{w}"]["scanned"] == ROWS // 1000
    # What each sweep left in the tables (pg_stat_user_tables around it): the first computation rewrote every row
    # once (never HOT: next_review_date is indexed) and inserted one event each; the steady state wrote nothing.
    first, steady = sweep["full_first_computation_w1"]["tables"], sweep["full_steady_state_w1"]["tables"]
    assert (first["customers"]["updated"], first["customers"]["hot_updated"]) == (ROWS, 0)
    assert first["customers"]["dead_tuples"] == ROWS and first["outbox_events"]["inserted"] == ROWS
    assert steady["customers"]["updated"] == steady["customers"]["dead_tuples"] == 0
    assert steady["outbox_events"]["inserted"] == 0
    assert set(first["customers"]["indexes_mib"]) >= {"customers_pkey", "customers_due_idx"}
    assert 0 < sweep["config_change"]["decrypted"] < ROWS
    assert report["references"]["naive"]["sample_rows"] == NAIVE_SAMPLE
    assert report["references"]["floor"]["full_first_computation"]["changed"] == ROWS
    assert report["checks"]["second_run_writes"]["full_steady_state_w1"] == {
        "customers": 0, "outbox_events": 0, "review_triggers": 0}
    assert all(plan["index_scan"] for plan in report["checks"]["plans"]), report["checks"]["plans"]
    assert report["startup"]["startup_s"] > 0
    cli = report["startup"]["cli_steady_state"]  # the CLI's wall against the floor, per worker count
    # ... cold and served by the resident launcher (cli/launcher.py), which ran every one of its commands
    assert [(p["workers"], p["launcher"]) for p in cli] == [(1, False), (1, True), (4, False), (4, True)]
    assert all(p["changed"] == 0 and p["scanned"] == ROWS for p in cli)
    launcher = report["startup"]["launcher"]
    assert len(launcher["runs"]) == len(report["startup"]["runs"]) and launcher["startup_s"] > 0
    assert all(run["scanned"] == 0 for run in launcher["runs"])
    if report["queue"]["status"] == "measured":  # and queue workers started as `queue work --drain` processes
        keys = ("cli_queue", "cli_queue_launcher", "cli_queue_launcher_seeded")
        probes = {key: report["startup"][key] for key in keys}
        for probe in probes.values():
            assert probe["done"] == probe["payments"] == 200
        # judged on the floor's own rows; the `seed payments` rows (random ids) are shown beside, not judged
        assert [(p["launcher"], p["rows"], p["within_goal"] is None) for p in probes.values()] == [
            (False, "floor", False), (True, "floor", False), (True, "seed", True)]
    assert report["checks"]["peak_rss"]["small"]["rows"] == SMALL_ROWS
    assert _scratch_databases(server_url, bench_run["pid"]) == set()  # none of this run's is left


@pytest.mark.slow
def test_checker_passes_the_run_and_names_a_missing_queue_section(bench_run: dict[str, Any]) -> None:
    """The checker accepts the run's report, whose queue section was measured; a report whose queue section was not
    fails it unless --allow-missing queue."""
    passed = _checker(bench_run["dir"] / "latest.json")
    assert passed.returncode == 0, passed.stdout
    assert bench_run["report"]["queue"]["status"] == "measured"
    missing = copy.deepcopy(bench_run["report"])
    missing["queue"] = {"status": "not measured", "reason": "no payments table"}
    assert "queue: not measured (no payments table)" in check.check_report(missing)
    assert [p for p in check.check_report(missing, allow_missing=("queue",)) if p.startswith("queue")] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda r: r["checks"]["second_run_writes"]["full_steady_state_w1"].update(customers=3),
         "a second run wrote rows"),
        (lambda r: r["sweep"]["full_first_computation_w4"].update(changed=ROWS - 1), "changed is 9999"),
        (lambda r: r["checks"]["plans"][0].update(index_scan=False), "is not an index scan"),
        (lambda r: r.pop("startup"), "startup is missing"),
        (lambda r: r["startup"]["cli_steady_state"][0].update(changed=2), "a steady-state sweep changed 2 rows"),
        (lambda r: r["sweep"]["config_change"].update(skipped_by_pre_check=0), "decrypted + skipped_by_pre_check"),
        (lambda r: r["references"]["floor"].pop("full_steady_state"), "full_steady_state is missing"),
        (lambda r: r["checks"]["peak_rss"].update(ratio_large_over_small=2.0), "ratio_large_over_small"),
        (lambda r: r["sweep"]["full_steady_state_w1"]["tables"]["customers"].update(updated=5),
         "full_steady_state_w1.tables.customers.updated is 5"),
        (lambda r: r["sweep"]["delta_0_1pct_due_w4"].update(changed=3), "delta_0_1pct_due_w4 must read and change"),
        (lambda r: r["startup"]["cli_queue_launcher_seeded"].update(within_goal=True),
         "judged only on the floor's rows"),
        (lambda r: r["startup"]["cli_queue"].update(within_goal=not r["startup"]["cli_queue"]["within_goal"]),
         "cli_queue.within_goal does not follow its ratio"),
    ],
)
def test_checker_finds_an_inconsistent_report(
    bench_run: dict[str, Any], tamper: Callable[[dict[str, Any]], Any], message: str
) -> None:
    """Each kind of inconsistency is reported by name."""
    report = copy.deepcopy(bench_run["report"])
    assert not [p for p in check.check_report(report, allow_missing=("queue",)) if message in p]
    tamper(report)
    assert any(message in p for p in check.check_report(report, allow_missing=("queue",)))


@pytest.mark.slow
def test_checker_fails_when_the_table_was_not_rendered_from_the_report(
    bench_run: dict[str, Any], tmp_path: Path
) -> None:
    """A hand-edited table next to the report is caught."""
    for name in ("latest.json", "latest.md", "throughput.png", "rss.png", "queue.png"):
        (tmp_path / name).write_bytes((bench_run["dir"] / name).read_bytes())
    assert _checker(tmp_path / "latest.json", "--allow-missing", "queue").returncode == 0
    table = tmp_path / "latest.md"
    table.write_text(table.read_text().replace("rows/s", "rows per second", 1))
    result = _checker(tmp_path / "latest.json", "--allow-missing", "queue")
    assert result.returncode == 1 and "was not rendered from this report" in result.stdout


def _fake_run_queue_bench(calls: list[dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """A stand-in of payments.benchmark.run_queue_bench with its documented return shape (test only)."""

    def run_queue_bench(database_url: str, *, payments: int = 100_000, quick: bool = False,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        calls.append({"url": database_url, "payments": payments, "quick": quick, "progress": progress})
        return {"payments": payments, "worker_processes": 2, "product_per_s": 4200.0, "floor_per_s": 6000.0,
                "ratio": 0.7, "pickup_latency_ms": {"p50": 3.5, "p99": 18.25, "samples": 400},
                "http_stub": {"latency_ms": 50, "concurrency": 64, "payments": 2000, "per_s": 1100.0,
                              "target_per_s": 1024.0}}

    return run_queue_bench


@pytest.mark.slow
def test_queue_section_is_rendered_into_table_chart_and_page(bench_run: dict[str, Any], tmp_path: Path) -> None:
    """run_queue_bench's figures land in the report, the markdown table, the queue chart and the benchmarks page."""
    calls: list[dict[str, Any]] = []
    said: list[str] = []
    section = queue.queue_section("postgresql+psycopg://bench/db", payments=2000, quick=True, progress=said.append,
                                  run=_fake_run_queue_bench(calls))
    assert calls == [{"url": "postgresql+psycopg://bench/db", "payments": 2000, "quick": True,
                      "progress": said.append}]
    report = dict(bench_run["report"], queue=section)
    assert check.check_report(report) == []
    page = tmp_path / "index.md"
    page.write_text(f"# x\n\n{render.TABLES_BEGIN}\nold figures\n{render.TABLES_END}\n\ntail\n")
    unmeasured = (bench_run["dir"] / "queue.png").read_bytes()
    outputs.write_outputs(report, tmp_path / "out", readme=page)
    table = (tmp_path / "out" / "latest.md").read_text()
    assert "4,200 payments/s (0.70× the floor)" in table
    assert "p50 3.5 ms · p99 18.2 ms" in table and "5.1k–6.9k jobs/s" in table
    assert "1,100 payments/s (target 1,024 payments/s)" in table
    assert (tmp_path / "out" / "queue.png").read_bytes() != unmeasured
    assert check.check_page(report, page) == [] and page.read_text().endswith("\n\ntail\n")
    assert check.check_outputs(report, tmp_path / "out") == []


def test_bad_options_exit_2_and_write_nothing(server_url: str, tmp_path: Path) -> None:
    """A size out of bounds is one line on stderr and exit 2, before any database or file is made."""
    out = tmp_path / "out"
    for argv, says in ((["--rows", "5"], "rows"), (["--quick", "--small-rows", "50000"], "small-rows"),
                       (["--workers", "1,x"], "workers"), (["--queue-payments", "0"], "queue-payments"),
                       (["--quick", "--only", "sweep,seeds"], "'seeds'"), (["--quick", "--only", ","], "none given"),
                       (["--quick", "--only", "startup,sweep"], "startup needs references")):
        result = subprocess.run([sys.executable, "-m", "batch_assets.cli", "bench", *argv, "--output-dir", str(out)],
                                env=_bench_env(server_url, tmp_path / "home"), capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2, (argv, result.stderr)
        assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("error: ")
        assert says in result.stderr, (argv, result.stderr)
    assert not out.exists()


@pytest.mark.slow
def test_only_runs_the_sections_named_and_the_checker_holds_the_report_to_them(
    server_url: str, tmp_path: Path
) -> None:
    """`--only sweep,rss` (the scaling runs): seeding, the product's sweeps and the peak RSS, nothing else; the
    report says so under `only`, passes the checker and merges into the scaling table, and the checker rejects it
    once it no longer says so, or when it holds a section it does not name."""
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "batch_assets.cli", "bench", "--quick", "--rows", str(ROWS), "--small-rows",
         str(SMALL_ROWS), "--only", "rss, sweep", "--run-date", RUN_DATE.isoformat(), "--output-dir", str(out)],
        env=_bench_env(server_url, tmp_path / "home"), capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "latest.json").read_text())
    assert report["only"] == ["sweep", "rss"] and report["command"] == "batch-assets bench --quick --only sweep,rss"
    assert "(1/6) seeding" in result.stderr and "(6/6) peak RSS" in result.stderr
    progress = "\n".join(line for line in result.stderr.splitlines() if line.startswith("bench ["))
    assert "naive" not in progress and "start-up" not in progress and "queue" not in progress
    assert report["references"] == {} and not {"startup", "queue", "outbox", "declared"} & set(report)
    assert "plans" not in report["checks"] and report["checks"]["peak_rss"]["large"]["rows"] == ROWS
    for key in ("full_first_computation_w1", "full_steady_state_w4", "delta_0_1pct_due_w4", "config_change"):
        assert report["sweep"][key]["scanned"] > 0
    assert "floor_time_ratio" not in report["sweep"]["full_first_computation_w1"]
    wal = report["sweep"]["full_first_computation_w1"]["tables"]["wal"]  # server-wide: at least the sweep's own
    assert wal["server_wide"] is True and wal["mib"] > 0 and wal["records"] >= ROWS and wal["full_page_images"] >= 0
    assert "Queue" not in (out / "latest.md").read_text() and not (out / "partial.json").exists()

    passed = _checker(out / "latest.json")
    assert passed.returncode == 0, passed.stdout
    scale = tmp_path / "scale.json"
    merged = subprocess.run([sys.executable, "-m", "batch_assets.bench.scaling", str(out / "latest.json"),
                             "--output", str(scale)], capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    assert json.loads(scale.read_text())["sizes"][0]["peak_rss_mib"] == report["checks"]["peak_rss"]["large"][
        "peak_rss_mib"]

    full = {k: v for k, v in report.items() if k != "only"}  # the same figures, no longer saying they are partial
    problems = check.check_report(full)
    assert any("references.naive is missing" in p for p in problems)
    assert any("startup is missing" in p for p in problems)
    assert any("no EXPLAIN of the delta first page" in p for p in problems)
    assert check.check_report(report) == []
    extra = dict(report, startup={"startup_s": 1.0})
    assert check.check_report(extra) == ["report has the startup section but report.only does not name it"]
    assert any("report.only must list sections" in p for p in check.check_report(dict(report, only=["sweeps"])))
    assert any("does not say --only sweep" in p
               for p in check.check_report(dict(report, command="batch-assets bench --quick")))


# --- the references, against the contract ------------------------------------------------------


def _categories(engine: sa.Engine) -> dict[str, tuple[str | None, date | None]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, age_category, next_review_date FROM customers")).all()
    return {str(r[0]): (r[1], r[2]) for r in rows}


def _expected(engine: sa.Engine, cipher: Any) -> dict[str, tuple[str, date]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, encrypted_dob FROM customers")).all()
    out = {}
    for customer_id, blob in rows:
        result = evaluate(parse_dob(cipher.decrypt_text(customer_id, bytes(blob))), RUN_DATE, DEFAULT_RULES)
        out[str(customer_id)] = (result.category, result.next_review_date)
    return out


def test_floor_writes_what_the_contract_says_and_nothing_on_a_second_pass(
    engine: sa.Engine, db_url: str, cipher: Any
) -> None:
    """The floor sets every category and date of the age-category rule (docs/reference/rules.md) with one event each;
    a second pass writes nothing."""
    seed_customers(engine, cipher, 2500, run_date=RUN_DATE, seed=5)
    first = references.run_floor(db_url, cipher, RUN_DATE, DEFAULT_RULES)
    assert first["scanned"] == first["changed"] == first["outbox_events"] == 2500 and first["pages"] == 3
    assert _categories(engine) == _expected(engine, cipher)
    second = references.run_floor(db_url, cipher, RUN_DATE, DEFAULT_RULES)
    assert second["scanned"] == 2500 and second["changed"] == 0 and second["outbox_events"] == 0
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outbox_events")).scalar() == 2500


def test_floor_counts_rows_it_cannot_evaluate_and_leaves_them(engine: sa.Engine, db_url: str, cipher: Any) -> None:
    """Rows with no ciphertext, a bad value or a foreign ciphertext are counted and not written."""
    report = seed_customers(engine, cipher, 1200, run_date=RUN_DATE, seed=6, bad_fraction=0.1)
    bad = sum(report.bad_by_kind.values())
    result = references.run_floor(db_url, cipher, RUN_DATE, DEFAULT_RULES)
    assert bad > 0 and result["failed"] == bad and result["changed"] == 1200 - bad
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM customers WHERE age_category IS NULL")).scalar() == bad


def test_naive_job_saves_its_sample_row_by_row_and_scales_with_its_offsets(
    engine: sa.Engine, db_url: str, cipher: Any
) -> None:
    """The naive job computes the contract's result for its sample only, and its estimate covers the whole table."""
    seed_customers(engine, cipher, 3000, run_date=RUN_DATE, seed=7)
    result = references.run_naive(db_url, cipher, RUN_DATE, DEFAULT_RULES, sample_rows=1500, table_rows=3000)
    assert result["sample_rows"] == 1500 and result["table_rows"] == 3000
    done = {k: v for k, v in _categories(engine).items() if v[0] is not None}
    expected = _expected(engine, cipher)
    assert len(done) == 1500 and all(expected[k] == v for k, v in done.items())
    assert [o["offset"] for o in result["offset_page_ms"]] == [0, 500, 1000, 1500, 2000]
    # The estimate is the per-row cost for every row plus every OFFSET page (figures rounded to 0.1 s).
    assert result["estimated_offset_pages_s"] >= 0
    assert result["estimated_s"] == pytest.approx(
        3000 * result["per_row_ms"] / 1000 + result["estimated_offset_pages_s"], abs=0.11)


# --- plan verdicts ----------------------------------------------------------------------------


def _plan(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"Plan": node}]


INDEX_SCAN = {"Node Type": "Index Scan", "Relation Name": "customers", "Index Name": "customers_due_idx"}
BITMAP_SCAN = {"Node Type": "Bitmap Heap Scan", "Relation Name": "payments",
               "Plans": [{"Node Type": "Bitmap Index Scan", "Index Name": "payments_pkey"}]}


@pytest.mark.parametrize(
    ("plan", "table", "keyset", "passes"),
    [
        ({"Node Type": "Limit", "Plans": [INDEX_SCAN]}, "customers", True, True),
        ({"Node Type": "Limit", "Plans": [{"Node Type": "Sort", "Plans": [INDEX_SCAN]}]}, "customers", True, False),
        ({"Node Type": "Limit", "Plans": [{"Node Type": "Seq Scan", "Relation Name": "customers"}]},
         "customers", True, False),
        ({"Node Type": "ModifyTable", "Relation Name": "payments", "Plans": [BITMAP_SCAN]}, "payments", False, True),
        ({"Node Type": "ModifyTable", "Relation Name": "payments",
          "Plans": [{"Node Type": "Hash Join", "Plans": [{"Node Type": "Seq Scan", "Relation Name": "payments"},
                                                         BITMAP_SCAN]}]}, "payments", False, False),
    ],
)
def test_plan_verdict_needs_index_access_and_an_index_order_for_keyset_reads(
    plan: dict[str, Any], table: str, keyset: bool, passes: bool
) -> None:
    """Index and bitmap-index scans pass; a sequential scan fails; a keyset read that sorts fails."""
    assert plans.verdict("q", table, _plan(plan), keyset=keyset)["index_scan"] is passes


def test_the_peak_rss_of_a_sweep_is_its_own_not_its_parents(db_url: str, cipher: Any, key_text: str) -> None:
    """The fresh process that measures a sweep's peak RSS reports its own peak, whatever its parent holds. (Linux
    carries getrusage's ru_maxrss across exec from the forked copy of the parent: with this process holding 400 MiB
    the child reported 400 MiB, and the bench's own report had 141.1 MiB, its parent's, at 100k and at 1M.)"""
    from batch_assets.bench import memory
    from batch_assets.db.engine import create_engine

    engine = create_engine(db_url, pool_size=2)
    try:
        seed_customers(engine, cipher, 2_000, run_date=RUN_DATE, seed=21)
    finally:
        engine.dispose()
    held = bytearray(400 * 1024 * 1024)
    for i in range(0, len(held), 4096):  # touch every page: resident, not only reserved
        held[i] = 1
    measured = memory.measure_rss(db_url, key_text, RUN_DATE)
    assert measured["scanned"] == 2_000
    assert 20 < measured["peak_rss_mib"] < 300, measured  # a sweep's few tens of MiB, never the parent's 400+
    del held


def test_each_timed_queue_drain_starts_after_a_checkpoint_when_the_role_may_run_one(
        db_url: str, engine: sa.Engine) -> None:
    """The queue bench's rows end their insert with a CHECKPOINT (bench.queue_harness.settle), so drains timed
    minutes apart start at the same point of the server's checkpoint cycle; a role without the privilege gets
    False and no error, and the report says which it was."""
    import uuid

    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    from batch_assets.bench.queue_harness import bench_rows, settle

    def requested() -> int:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT checkpoints_req FROM pg_stat_bgwriter").scalar_one())

    before = requested()
    rows = bench_rows(db_url)
    rows.insert(10)
    assert rows.settled is True and requested() > before
    name = f"ba_bench_{uuid.uuid4().hex[:12]}"
    role = sql.Identifier(name)
    with psycopg.connect(rows.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
        try:
            as_role = make_url(db_url).set(drivername="postgresql", username=name, password=None)
            assert settle(as_role.render_as_string(hide_password=False)) is False
        finally:
            conn.execute(sql.SQL("DROP ROLE {}").format(role))
    rows.delete()
