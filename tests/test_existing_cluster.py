"""launch.py on a machine where `ray start` already runs a Ray cluster, with real processes.

A head started by `ray start --head` (4 CPUs, loopback only, token authentication as `ray start` sets it up on this
machine) under a private TMPDIR, where `ray start` records it and where the `launch.py` subprocesses look for it;
no other process on the machine sees it. It is stopped by process id at the end: `ray stop` would stop every Ray
process on the machine, other users' clusters included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from private_heads import start_head, stop_processes_under
from short_runs import ROOT, SHORT

from reporting.run_dir import RunDirectory


@dataclass(frozen=True)
class Head:
    address: str  # as `ray start` recorded it in TMPDIR/ray/ray_current_cluster
    env: dict[str, str]  # the environment it was started with: its private TMPDIR, loopback, no RAY_ADDRESS


def gcs_running(address: str) -> bool:
    """Whether a raylet on this machine still serves the cluster at ``address``."""
    from ray._private import services

    services.find_gcs_addresses.cache_clear()
    return address in services.find_gcs_addresses()


@pytest.fixture(scope="module")
def head():
    from tinycoder import ensure_model

    ensure_model("test", progress=False)
    temp = tempfile.mkdtemp(dir="/tmp", prefix="pr")  # Ray's socket paths under it stay far below 107 bytes
    env = {**os.environ, "TMPDIR": temp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    # The CLI through this interpreter: a `ray` script may not sit beside it (Ray on PYTHONPATH, a user install).
    ray_cmd = [sys.executable, "-m", "ray.scripts.scripts"]
    try:
        start, (gcs, *_) = start_head(  # on ports of its own, not the defaults another cluster on this machine may hold
            lambda ports: [*ray_cmd, "start", "--head", "--num-cpus", "4", "--include-dashboard=false",
                           "--disable-usage-stats", f"--port={ports[0]}", f"--dashboard-agent-listen-port={ports[1]}",
                           f"--metrics-export-port={ports[2]}", f"--ray-client-server-port={ports[3]}"],
            ports=4, tmpdir=temp, env=env, timeout=180)
        assert start.returncode == 0, start.stderr[-3000:]
        address = (Path(temp) / "ray" / "ray_current_cluster").read_text().strip()
        assert address == f"127.0.0.1:{gcs}"
        yield Head(address, env)
    finally:
        stop_processes_under(temp)
        shutil.rmtree(temp, ignore_errors=True)


def launch(head: Head, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, env={**head.env, **env},
                          capture_output=True, text=True, timeout=600)


def test_dry_run_checks_the_running_cluster(head):
    out = launch(head, "--dry-run", *SHORT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"# resources of Ray cluster at {head.address}, already running on this machine (started by `ray start`; "
            "RAY_ADDRESS=local starts a separate one)") in out.stdout
    assert "CPU: need 1.5, have 4 (ok)" in out.stdout  # the cluster's CPUs, not this machine's
    assert "Traceback" not in out.stdout + out.stderr


def test_a_recorded_cluster_that_does_not_answer_is_an_error_line(head):
    """The head binds loopback only; without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 Ray dials this machine's IP."""
    env = {k: v for k, v in head.env.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    dialled = subprocess.run([sys.executable, "-c", "import sys; from ray._private import services; "
                              "print(services.canonicalize_bootstrap_address(sys.argv[1]))", head.address],
                             env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    if dialled == head.address:
        pytest.skip("this machine has no address but loopback: Ray dials the head where it listens")
    out = subprocess.run([sys.executable, "launch.py", "--dry-run", *SHORT], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stdout + out.stderr
    error = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, out.stderr[-3000:]
    assert f"`ray start` runs on this machine at {head.address}" in error[0]
    assert "`ray stop`" in error[0] and "RAY_ADDRESS=local python launch.py" in error[0]
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in error[0]


def test_run_attaches_to_the_running_cluster_and_leaves_it_running(head, tmp_path):
    run_dir = tmp_path / "run"
    out = launch(head, "--run-dir", str(run_dir), "run.steps=2", *SHORT)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "Traceback" not in out.stdout + out.stderr
    assert (f"connecting: Ray cluster at {head.address}, already running on this machine (started by `ray start`; "
            "RAY_ADDRESS=local starts a separate one)") in out.stdout
    assert "dashboard: not running: the cluster runs no dashboard" in out.stdout
    assert [row["step"] for row in RunDirectory(run_dir).read_metrics()] == [1, 2]
    assert gcs_running(head.address)  # the run only detached from it


CONNECT = """
import ray
from actors.cluster import connect
connection = connect(1, dashboard=False)
print(connection.description)
print("gcs", ray.get_runtime_context().gcs_address)
ray.shutdown()
"""


def test_ray_address_local_starts_a_separate_cluster(head):
    """The dry run plans for a new local cluster, and the run's ``connect`` starts one beside the running head (the
    whole run with RAY_ADDRESS=local is what every short run of the suite does: ``short_runs.launch_env``)."""
    out = launch(head, "--dry-run", *SHORT, RAY_ADDRESS="local")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "# resources of this machine (RAY_ADDRESS=local: a separate local cluster would be started)" in out.stdout
    out = subprocess.run([sys.executable, "-c", CONNECT], cwd=ROOT, env={**head.env, "RAY_ADDRESS": "local"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    description, gcs = out.stdout.splitlines()[-2:]
    assert description.startswith("a local Ray cluster (") and description.endswith("; RAY_ADDRESS=local)")
    assert gcs.startswith("gcs ") and gcs != f"gcs {head.address}"
    assert gcs_running(head.address)
