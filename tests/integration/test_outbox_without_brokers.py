"""The brokers' client libraries are optional (the `brokers` extra): without redis, aio-pika and nats-py the relay
and the file sink work, and choosing a broker sink is a one-line ConfigError naming BATCH_ASSETS_OUTBOX_SINK and
the extra to install.

Each check runs in a fresh interpreter where importing those libraries fails, as it does where they are not
installed (`sys.modules[name] = None` makes `import name` raise ImportError)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.integration

BROKER_LIBRARIES = ("redis", "aio_pika", "nats")

WITHOUT_BROKERS = textwrap.dedent(f"""
    import sys
    for name in {BROKER_LIBRARIES!r}:
        sys.modules[name] = None
""")


def _run(script: str, *args: str) -> object:
    """Run `script` without the brokers' libraries; what it printed last, as JSON."""
    done = subprocess.run([sys.executable, "-c", WITHOUT_BROKERS + textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_relay_sends_to_a_file_without_any_broker_library(engine: sa.Engine, db_url: str, tmp_path: Path) -> None:
    """Without redis, aio-pika and nats-py, the relay (and the relay job's module) import, and a pass sends every
    PENDING event to the file sink and marks it SENT."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_events (aggregate_id, event_type, payload) "
            "SELECT gen_random_uuid(), 'age_category_changed', '{}'::jsonb FROM generate_series(1, 7)")
    out = tmp_path / "outbox.jsonl"
    result = _run("""
        import json
        import batch_assets.orchestration.outbox_job  # the relay job's module, with every sink resource
        from batch_assets.db.engine import create_engine
        from batch_assets.outbox.relay import relay_outbox
        from batch_assets.outbox.sinks import make_sink
        from batch_assets.settings import OutboxSinkTarget

        engine = create_engine(sys.argv[1])
        try:
            relayed = relay_outbox(engine, sink=make_sink(OutboxSinkTarget("file", sys.argv[2])), batch_size=5)
        finally:
            engine.dispose()
        print(json.dumps({"ok": relayed.ok, "sent": relayed.sent}))
    """, db_url, str(out))
    assert result == {"ok": True, "sent": 7}
    assert len(out.read_text(encoding="utf-8").splitlines()) == 7
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT status, count(*) FROM outbox_events GROUP BY status").all() == [("SENT", 7)]


@pytest.mark.parametrize(
    ("kind", "url", "package"),
    [("redis", "redis://127.0.0.1:6379/0", "redis"),
     ("amqp", "amqp://guest:secret@127.0.0.1:5672/%2F", "aio-pika"),
     ("nats", "nats://127.0.0.1:4222", "nats-py")],
)
def test_choosing_a_broker_whose_library_is_missing_names_the_setting_and_the_extra(
    kind: str, url: str, package: str
) -> None:
    """make_sink and the relay job's sink resource both refuse the broker at once (not at the first batch) with
    ConfigError: one line naming BATCH_ASSETS_OUTBOX_SINK, the missing package and the pip extra; no password."""
    result = _run("""
        import json
        from batch_assets.errors import ConfigError
        from batch_assets.orchestration import outbox_job
        from batch_assets.outbox.sinks import make_sink
        from batch_assets.settings import OutboxSinkTarget

        kind, url = sys.argv[1:3]
        resource = {"redis": outbox_job.RedisSinkResource, "amqp": outbox_job.RabbitMQSinkResource,
                    "nats": outbox_job.NatsSinkResource}[kind](url=url)
        errors = []
        for choose in (lambda: make_sink(OutboxSinkTarget(kind, url), timeout_s=5.0), lambda: resource.open_sink(5.0)):
            try:
                choose()
            except ConfigError as exc:
                errors.append([str(exc), exc.field, exc.exit_code])
            else:
                errors.append(None)
        print(json.dumps(errors))
    """, kind, url)
    expected = (f"BATCH_ASSETS_OUTBOX_SINK: the {'rabbitmq' if kind == 'amqp' else kind} sink needs the Python "
                f"package {package}, which is not installed: pip install 'batch-assets[brokers]'")
    assert result == [[expected, "BATCH_ASSETS_OUTBOX_SINK", 2]] * 2


def test_outbox_relay_command_refuses_a_broker_without_its_library_before_any_run(
    cli_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    """`batch-assets outbox relay` with a RabbitMQ sink and no aio-pika: exit 2, one line naming the variable and the
    extra, the JSON line, no run started (no run id), no password shown."""
    env = {**cli_env, "BATCH_ASSETS_OUTBOX_SINK": "amqp://guest:secret@127.0.0.1:5672/%2F"}
    launcher = WITHOUT_BROKERS + "import runpy; runpy.run_module('batch_assets.cli', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", launcher, "outbox", "relay"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = [text for text in done.stderr.splitlines() if text.startswith("error:")]
    assert "BATCH_ASSETS_OUTBOX_SINK" in line and "batch-assets[brokers]" in line and "secret" not in done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["status"] == "FAILURE" and summary["run_id"] is None
