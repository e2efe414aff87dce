"""The several-hosts rig (faults/hosts.py, `make hosts`): its namespaces come up and go away, and a sweep runs on 3.

The kill scenarios (a host lost mid-range, a queue worker killed mid-call) run in `make hosts` and `make faults`
(minutes: they wait for leases to lapse); here only the rig's own pieces. Root and `ip netns` are needed: the
tests skip cleanly without them, and the sweep test also without RabbitMQ.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from faults import hosts
from faults.brokers import RabbitVhost

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning"),
]

NS_TEST_INDEX = 9
"""The namespace test's host (bah9); the sweep test uses bah7..bah9, the campaign bah4..6, `make hosts` bah1..3."""


@pytest.fixture(scope="module")
def can_host() -> None:
    reason = hosts.unavailable_reason()
    if reason is not None:
        pytest.skip(f"the rig cannot run here: {reason}")


def _tcp_port(server_url: str) -> int:
    url = make_url(server_url)
    if not url.host or url.host.startswith("/"):
        pytest.skip("the test PostgreSQL is not on TCP (the hosts reach it through a forwarded port)")
    return int(url.port or 5432)


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


def _netns() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()


PROBE = """
import os, socket, sys
own_net = os.stat('/proc/self/ns/net').st_ino
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5):
    reached = True
print(socket.gethostname(), os.getpid(), own_net, reached, flush=True)
"""


def test_a_host_has_its_own_namespaces_reaches_the_database_and_leaves_nothing(
    can_host: None, server_url: str, tmp_path: Path
) -> None:
    """Debris of an earlier run is removed; inside, the host has its hostname, pid 1 and network of its own and
    reaches PostgreSQL through its gateway; after `down()` no namespace, veth or process of it is left."""
    port = _tcp_port(server_url)
    name = f"{hosts.PREFIX}{NS_TEST_INDEX}"
    # Debris: a namespace and a veth left by a run that was killed.
    subprocess.run(["ip", "netns", "add", name], check=False, capture_output=True)
    subprocess.run(["ip", "link", "add", f"{name}o", "type", "veth", "peer", "name", f"{name}i"], check=False,
                   capture_output=True)
    assert name in hosts.remove_debris(range(NS_TEST_INDEX, NS_TEST_INDEX + 1))
    assert name not in _netns() and f" {name}o" not in _links()

    host = hosts.TestHost(NS_TEST_INDEX)
    try:
        host.up()
        host.forward(port)
        out = tmp_path / "probe.out"
        proc = host.start([sys.executable, "-c", PROBE, host.gateway, str(port)], dict(os.environ), out)
        assert proc.wait(timeout=60) == 0, out.read_text()
        hostname, pid, net, reached = out.read_text().split()[-4:]
        assert hostname == host.hostname and hostname != socket.gethostname()
        assert pid == "1"  # its own pid namespace: the process is its init
        assert int(net) != os.stat("/proc/self/ns/net").st_ino
        assert reached == "True"
        # A process left running in the host is ended by down(), by its pid.
        sleeper = host.start(["sleep", "600"], dict(os.environ), tmp_path / "sleep.out")
        assert hosts._wait_for(lambda: len(host.pids()) >= 2, timeout=20, poll=0.1)
        pids = host.pids()
    finally:
        host.down()
    assert sleeper.poll() is not None
    assert name not in _netns() and f" {name}o" not in _links()
    assert not [p for p in pids if hosts.process_alive(p)]


@pytest.fixture
def three_hosts(can_host: None, server_url: str, tmp_path: Path):
    _tcp_port(server_url)
    if not RabbitVhost.available(*hosts.DEFAULT_AMQP):
        pytest.skip("no RabbitMQ (and rabbitmqctl) on 127.0.0.1:5672")
    admin = make_url(server_url).set(database="postgres").render_as_string(hide_password=False)
    with hosts.rig(tmp_path / "rig", database_url=admin, first_index=7) as r:
        yield r
    assert not [h.netns for h in r.hosts if h.netns in _netns()]


def test_a_sweep_runs_its_ranges_on_three_hosts(three_hosts: hosts.Rig) -> None:
    """A full sweep on the celery job over RabbitMQ, its 6 ranges on workers in 3 namespaces: SUCCESS, every row."""
    r = three_hosts
    rows = 6_000
    r.must("db", "migrate")
    r.must("seed", "customers", "--rows", str(rows), "--run-date", date.today().isoformat())
    r.start_celery_workers()
    run = r.launch_sweep("full", date.today().isoformat(), 6, "test")
    done = run.finish(timeout=300)
    summary = done.summary or {}
    assert done.rc == 0 and summary.get("status") == "SUCCESS", done.stderr[-3000:]
    assert summary["scanned"] == rows and summary["ranges"] == 6
    ran_on = hosts.steps_by_host(summary["run_id"], r.home)
    assert {k for k in ran_on if k.startswith("sweep_range[")} == {f"sweep_range[r{i:03d}_of_006]" for i in range(6)}
    assert set(ran_on.values()) <= {h.hostname for h in r.hosts}
    assert len(set(ran_on.values())) >= 2  # the ranges were shared by the hosts
