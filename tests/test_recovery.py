"""Faults on a real local Ray cluster: an actor's process killed with SIGKILL mid-run (each kind), the
driver killed while it writes a checkpoint, a damaged checkpoint, and the clear errors users meet.

The in-process runs share one Ray cluster (``ray_session``); ``train`` attaches to it and leaves it up.
A fault-free reference run and a faulty one, 6 steps each on the tiny test model, evolution at steps 2 and 4:
the faulty run kills each actor kind in turn, the last one twice (the learner, then its replacement during the
recovery). It must end with each step once in metrics.jsonl, a recovery record per fault, and the same league
state and adapters as the reference.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray

from actors.cluster import NAMESPACE
from checkpoints import CheckpointWriteError
from reporting.run_dir import RunDirectory
from configs import load_config
from learners.shared_base_paths import default_shm_dir

from reporting.run_dir import comparable_state as run_state
from short_runs import ROOT, launch_env
from short_runs import SHORT as BASE_SHORT

STEPS = 6
SHORT = BASE_SHORT + [f"run.steps={STEPS}", "verifier.actors=2"]  # a killed verifier's work has another to go to
CLASSES = {"LearnerActor", "InferenceActor", "LeagueActor", "VerifierActor"}
OURS = ("populora-", ".populora-", "verifier-")  # what our actors put in /dev/shm


def shm_entries() -> set[str]:
    """Our entries in the RAM-backed directory the run uses (/dev/shm, or the suite worker's ``POPULORA_SHM_DIR``)."""
    return {p.name for p in default_shm_dir().iterdir() if p.name.startswith(OURS)}


@pytest.fixture(scope="module")
def ray_session():
    from tinycoder import ensure_model

    ensure_model("test", progress=False)
    ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), namespace=NAMESPACE, include_dashboard=False,
             logging_level="WARNING")
    yield
    ray.shutdown()


def actor_pids() -> dict[str, int]:
    """Name -> pid of every live named actor of ours (from the GCS actor table)."""
    out = {}
    for info in ray._private.state.actors().values():
        if info["ActorClassName"] in CLASSES and info["State"] == "ALIVE" and info.get("Pid"):
            out[info["Name"]] = info["Pid"]
    return out


def all_pids() -> set[int]:
    return {info["Pid"] for info in ray._private.state.actors().values()
            if info["ActorClassName"] in CLASSES and info.get("Pid")}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def starting_pid(name: str, not_pid: int) -> int | None:
    """The pid of the actor named ``name`` that is being created or runs, other than ``not_pid``."""
    for info in ray._private.state.actors().values():
        if (info["Name"] == name and info.get("Pid") and info["Pid"] != not_pid
                and info["State"] in ("PENDING_CREATION", "ALIVE")):
            return info["Pid"]
    return None


def run_in_process(run_dir: Path, kills: list[tuple[int, str, bool]] = (), max_recoveries: int = 3) -> tuple[int, set[int]]:
    """Train ``STEPS`` steps in this process; ``kills``: (step, actor, replacement too), in step order: SIGKILL the
    actor's process once that step's row is in metrics.jsonl and, with ``replacement``, then the process of the
    actor the recovery starts in its place, as soon as it appears. Returns the exit code and every actor pid seen."""
    from actors.driver import train

    config = load_config(None, SHORT + [f"run.run_dir={run_dir}", f"run.max_recoveries={max_recoveries}"])
    seen: set[int] = set()
    killed: list[int] = []
    done = threading.Event()

    def killer() -> None:
        due = sorted(kills)
        replaced: int | None = None  # the killed pid whose replacement dies next
        run = RunDirectory(run_dir)
        while not done.is_set() and due:
            step, name, replacement = due[0]
            pid = None
            if replaced is not None:
                pid = starting_pid(name, replaced)
            elif any(r["step"] == step for r in run.read_metrics()):
                pid = actor_pids().get(name)
            if pid:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                if replacement and replaced is None:
                    replaced = pid
                else:
                    replaced = None
                    due.pop(0)
            time.sleep(0.02)

    thread = threading.Thread(target=killer, daemon=True) if kills else None
    if thread:
        thread.start()
    try:
        code = train(config)
        seen |= all_pids()
    finally:
        done.set()
        if thread:
            thread.join()
    want = sum(1 + replacement for _, _, replacement in kills)
    assert len(killed) == want, f"killed {len(killed)} of {want} process(es) for {kills}"
    return code, seen | set(killed)


def wait_gone(pids: set[int], before: set[str]) -> None:
    """Every actor process of the run has exited and nothing of ours was left in /dev/shm."""
    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in pids if pid_alive(p)], "actor processes left behind"
    assert shm_entries() <= before, f"left in /dev/shm: {shm_entries() - before}"


@pytest.fixture(scope="module")
def reference(ray_session, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    code, _ = run_in_process(run_dir)
    assert code == 0
    return run_state(run_dir, STEPS)


# One run kills each kind in turn (a run per kind cost ~35 s each of CI), the student learner last, and then its
# replacement while the recovery starts it: the half-started system is stopped (nothing left behind), the failed
# attempt is recorded and counted, the next one succeeds.
KILLS = [(1, "learner-teacher", False), (2, "inference", False), (3, "league", False), (4, "verifier-0", False),
         (5, "learner-student", True)]


def test_each_actor_kind_killed_mid_run_is_recovered_and_nothing_is_lost(reference, tmp_path, capfd):
    before = shm_entries()
    run_dir = tmp_path / "run"
    code, pids = run_in_process(run_dir, kills=KILLS, max_recoveries=5)
    assert code == 0
    run = RunDirectory(run_dir)
    assert [r["step"] for r in run.read_metrics()] == list(range(1, STEPS + 1))
    events = run.read_events("recovery")
    # Ray restarts a verifier and the pool resubmits its tasks: no driver recovery for verifier-0
    assert [e["actors"] for e in events[:4]] == [["learner-teacher"], ["inference"], ["league"], ["learner-student"]], events
    assert [e["recovery"] for e in events] == [1, 2, 3, 4, 5], events
    steps = [step for step, name, _ in KILLS if not name.startswith("verifier")]  # [1, 2, 3, 5]
    for step, event in zip(steps, events[:4]):
        assert event["failed_step"] in (step, step + 1), event  # killed after step's row: in its checkpoint or the next
    assert events[3]["restored_step"] is None and "Actor" in events[3]["attempt_error"], events[3]
    for step, event in zip(steps, events[:3] + events[4:]):  # the successful recoveries
        assert event["restored_step"] in range(step + 1) and event["seconds_lost"] > 0, event
    err = capfd.readouterr().err
    assert "recovery 4 failed" in err, err[-3000:]
    assert all(f"recovered ({i} of at most 5)" in err for i in (1, 2, 3, 5)), err[-3000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["recoveries"] == 5 and status["last_step"] == STEPS
    league, adapters, rows = run_state(run_dir, STEPS)
    assert league == reference[0]
    assert adapters == reference[1]
    assert rows == reference[2]
    wait_gone(pids, before)


def launch(*args: str, timeout: int = 600) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "launch.py", *args], cwd=ROOT, env=launch_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_driver_killed_mid_checkpoint_then_resume_skips_a_damaged_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    driver = launch("--run-dir", str(run_dir), *SHORT)
    tmp3 = run_dir / "checkpoints" / ".tmp-step-3"
    try:
        while driver.poll() is None and not tmp3.exists():
            time.sleep(0.002)
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and its local Ray cluster, mid-write of step-3
    finally:
        driver.wait(timeout=60)
    assert driver.returncode == -signal.SIGKILL
    assert tmp3.exists() and not (run_dir / "checkpoints" / "step-3").exists(), "the kill missed the checkpoint write"
    run = RunDirectory(run_dir)
    assert run.latest_checkpoint().name == "step-2"
    assert json.loads((run_dir / "status.json").read_text())["state"] == "running"
    optimizers = next((run_dir / "checkpoints" / "step-2" / "learners").glob("*/optimizers.pt"))
    optimizers.write_bytes(optimizers.read_bytes()[:-100])  # damaged after the fact

    resumed = launch("--resume", str(run_dir), "--steps", "2")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert "checkpoint step-2 is damaged (learners/" in err and "truncated" in err and "using the one before it" in err
    assert "its driver stopped without recording why" in out
    assert "continuing at step 2" in out
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.create(load_config())
    run.save_checkpoint(1, lambda d: (d / "league.json").write_text("{}"))

    def write_to_a_full_disk(directory: Path) -> None:
        (directory / "optimizers.pt").symlink_to("/dev/full")  # the kernel answers ENOSPC, as a full disk does
        (directory / "optimizers.pt").write_bytes(b"x" * 4096)

    with pytest.raises(CheckpointWriteError) as info:
        run.save_checkpoint(2, write_to_a_full_disk)
    message = str(info.value)
    assert "the disk is full" in message and "step-1 is kept" in message and f"--resume {run.root}" in message
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert not (run.checkpoints / ".tmp-step-2").exists()
    assert run.latest_checkpoint().name == "step-1"


def test_a_missing_or_incomplete_model_directory_is_a_clear_error(tmp_path, tiny_qwen2, capsys):
    import launch as launcher

    assert launcher.main(["--run-dir", str(tmp_path / "r1"), f"model.path={tmp_path / 'nowhere'}"]) == 2
    assert "config.json" in capsys.readouterr().err
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((tiny_qwen2 / "config.json").read_text())
    assert launcher.main(["--run-dir", str(tmp_path / "r2"), f"model.path={partial}"]) == 2
    err = capsys.readouterr().err
    assert f"the model directory {partial} is incomplete" in err and "no weights" in err and "tokenizer" in err
    assert "Traceback" not in err


def test_a_cluster_without_the_plans_gpus_is_a_clear_error(tmp_path, capsys):
    import launch as launcher

    if launcher.local_cluster_view().total.get("GPU"):
        pytest.skip("this machine has GPUs")
    assert launcher.main(["--run-dir", str(tmp_path / "r"), "model.tiny_variant=test", "resources.learner_gpus=1"]) == 1
    err = capsys.readouterr().err
    assert "lacks resources the placement plan needs" in err and "GPU: need 1, have 0" in err and "--dry-run" in err


def test_an_actor_killed_by_rays_memory_monitor_is_recovered(tmp_path):
    """A real kill by Ray's memory monitor: the run's cluster gets a threshold 5 GiB above this machine's memory use
    (``RAY_memory_usage_threshold``; far above what the run and other processes add), and once step 1 is done this
    test allocates up to 7 GiB and holds it until the driver reports that the raylet killed one of the run's engine,
    learner or league actors (it may kill verifiers first, which their pool replaces), then frees it. The run names
    the cause and the largest memory users Ray reported, waits for the memory to go, recovers from its checkpoint
    and ends with every step once."""
    import psutil

    memory = psutil.virtual_memory()
    margin, most = 5 * 2**30, 7 * 2**30
    if memory.available < most + 6 * 2**30:
        pytest.skip(f"needs {(most + 6 * 2**30) / 2**30:.0f} GiB of free memory ({memory.available / 2**30:.1f})")
    threshold = (memory.total - memory.available + margin) / memory.total
    env = launch_env({"RAY_memory_usage_threshold": f"{threshold:.4f}", "RAY_memory_monitor_refresh_ms": "100"})
    run_dir = tmp_path / "run"
    driver = subprocess.Popen([sys.executable, "launch.py", "--run-dir", str(run_dir), *BASE_SHORT, "run.steps=40",
                               "run.max_recoveries=3", "run.cluster_wait_s=90"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    err: list[str] = []
    out: list[str] = []
    readers = [threading.Thread(target=lambda: err.extend(driver.stderr), daemon=True),
               threading.Thread(target=lambda: out.extend(driver.stdout), daemon=True)]  # each pipe read by one reader
    for reader in readers:
        reader.start()
    blocks: list[bytearray] = []
    try:
        deadline = time.monotonic() + 300
        while driver.poll() is None and not ((run_dir / "metrics.jsonl").exists() and RunDirectory(run_dir).read_metrics()):
            assert time.monotonic() < deadline, "step 1 never finished"
            time.sleep(0.1)
        killed = lambda: any("memory monitor killed" in line for line in err)  # noqa: E731  (the driver's own line)
        block = 2**30
        while not killed() and driver.poll() is None and len(blocks) * block < most \
                and psutil.virtual_memory().available > 3 * block:
            blocks.append(bytearray(block))
            blocks[-1][::4096] = b"\x01" * (block // 4096)  # touch every page: memory in use, not just reserved
        held = time.monotonic()  # Ray may kill verifiers first (their pool replaces them): hold until the driver sees one
        while not killed() and driver.poll() is None and time.monotonic() - held < 90:
            time.sleep(0.05)
        assert killed(), f"no actor of the run was killed by the memory monitor ({len(blocks)} GiB allocated): " \
            + "".join(err)[-2000:]
    finally:
        blocks.clear()  # free it: the run waits for the memory to go before it restarts its actors
        driver.wait(timeout=600)
        for reader in readers:
            reader.join(timeout=10)
    text = "".join(err)
    (tmp_path / "stderr.txt").write_text(text)
    assert driver.returncode == 0, text[-3000:]
    assert "Ray's memory monitor killed an actor" in text and "largest memory users (pid, GB, command):" in text
    assert "below the threshold; restarting after" in text
    recovered = text.split("recovered (1 of at most 3)")
    assert len(recovered) == 2 and "(OutOfMemoryError)" in recovered[1].splitlines()[0]
    run = RunDirectory(run_dir)
    assert [r["step"] for r in run.read_metrics()] == list(range(1, 41))
    recoveries = run.read_events("recovery")
    assert len(recoveries) == 1 and "OutOfMemoryError" in recoveries[0]["error"] and "memory_kill" in recoveries[0]
