"""Overlapped steps (run.max_staleness: 1): the engines generate step t+1 with adapters one update behind
while the learners train on step t. The rules at step boundaries (actors/loop.py), the start-up errors, and
on a real local Ray cluster: the staleness pattern, and a run resumed or recovered from a checkpoint ending
with the same adapters, league and rows as the uninterrupted overlapped run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import ray
from pydantic import ValidationError

from actors.cluster import NAMESPACE
from actors.loop import drains_after
from configs import load_config
from reporting.run_dir import RunDirectory
from reporting.run_dir import comparable_state as run_state
from short_runs import SHORT

OVERLAP = ["rl.importance_correction=tis", "run.max_staleness=1", "resources.inference_cpus=1", "resources.learner_cpus=1"]
# 4 steps, checkpoints after 2 and 4, evolution at 2 (due at 4 too, but never at the last step): boundaries 1->2 and
# 3->4 overlap, 2->3 drains.
RUN = SHORT + OVERLAP + ["run.steps=4", "run.checkpoint_every=2", "evolution.period=2", "run.max_recoveries=2"]


def test_the_pipeline_drains_after_checkpoint_evolution_and_last_steps():
    config = load_config(None, OVERLAP + ["run.checkpoint_every=4", "evolution.period=3"])
    assert [drains_after(config, step, last_step=9) for step in range(1, 10)] == [
        False, False, True, True, False, True, False, True, True]  # 3, 6, 9: evolution; 4, 8: checkpoint; 9: last
    off = load_config(None, ["evolution.enabled=false", *OVERLAP, "run.checkpoint_every=100"])
    assert not any(drains_after(off, step, 9) for step in range(1, 9)) and drains_after(off, 9, 9)
    serial = load_config(None, [])
    assert all(drains_after(serial, step, 9) for step in range(1, 10))


@pytest.mark.parametrize("overrides, named", [
    (["run.max_staleness=1", "resources.inference_cpus=1", "resources.learner_cpus=1"],
     ["run.max_staleness", "rl.importance_correction"]),
    (["run.max_staleness=1", "rl.importance_correction=tis"],  # the tiny default reserves 0.5 and 0.25 of a core
     ["run.max_staleness", "resources.inference_cpus", "resources.learner_cpus", "resources.inference_gpus"]),
    (["run.max_staleness=2"], ["max_staleness"]),
])
def test_overlap_that_cannot_run_is_an_error_at_start_up_naming_the_keys(overrides, named):
    with pytest.raises((ValidationError, ValueError)) as err:
        load_config(None, overrides)
    for key in named:
        assert key in str(err.value)
    load_config(None, ["run.max_staleness=1", "rl.importance_correction=tis", "resources.inference_gpus=1",
                       "resources.learner_gpus=1"])  # separate GPUs: fine


@pytest.fixture(scope="module")
def ray_session():
    from tinycoder import ensure_model

    ensure_model("test", progress=False)
    ray.init(address="local", num_cpus=max(6, os.cpu_count() or 1), namespace=NAMESPACE, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


def kill_after(run_dir: Path, step: int, actor: str, killed: list[int], done: threading.Event) -> None:
    """SIGKILL ``actor``'s process once step ``step``'s row is written (the next step's rollouts are then in flight)."""
    metrics = run_dir / "metrics.jsonl"
    while not done.is_set() and not killed:
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        if any(r.get("step") == step for r in rows):
            for info in ray._private.state.actors().values():
                if info["Name"] == actor and info["State"] == "ALIVE" and info.get("Pid"):
                    os.kill(info["Pid"], signal.SIGKILL)
                    killed.append(info["Pid"])
        time.sleep(0.02)


@pytest.mark.slow
def test_overlapped_run_resumes_and_recovers_exactly(ray_session, tmp_path):
    from actors.driver import train

    reference_dir = tmp_path / "reference"
    assert train(load_config(None, RUN + [f"run.run_dir={reference_dir}"]), output="quiet") == 0
    league, adapters, rows = run_state(reference_dir, 4)
    assert [r["staleness"] for r in rows] == [0, 1, 0, 1]
    for row in rows:  # the learners' stats say how many updates lay between generating and training adapters
        behind = {m: s["behind"] for m, s in row["train"].items() if "behind" in s}
        assert behind and set(behind.values()) <= {0.0, 1.0}
        assert (row["staleness"] == 1) == (1.0 in behind.values()), (row["step"], behind)
        assert all(s.get("dropped_behaviour") == 0.0 and 0 < s["is_weight"] <= 2.0 for s in row["train"].values() if "is_weight" in s)
    assert rows[1]["evolution"] and rows[3]["evolution"] == [], "evolution is due at steps 2 and 4, 4 being the last"

    resumed_dir = tmp_path / "resumed"  # from the step-2 checkpoint, drained there as in the reference
    shutil.copytree(reference_dir, resumed_dir)
    (resumed_dir / "checkpoints" / "latest").write_text("step-2")
    assert train(load_config(None, RUN + [f"run.run_dir={resumed_dir}"]), resume=True, output="quiet") == 0  # to step 4
    assert run_state(resumed_dir, 4) == (league, adapters, rows)

    recovered_dir = tmp_path / "recovered"  # the student learner dies in step 4, step 4's rollouts in flight
    killed: list[int] = []
    done = threading.Event()
    killer = threading.Thread(target=kill_after, args=(recovered_dir, 3, "learner-student", killed, done), daemon=True)
    killer.start()
    try:
        assert train(load_config(None, RUN + [f"run.run_dir={recovered_dir}"]), output="quiet") == 0
    finally:
        done.set()
        killer.join()
    assert killed, "the learner was never killed"
    events = RunDirectory(recovered_dir).read_events("recovery")
    assert len(events) == 1 and events[0]["restored_step"] == 2, events
    assert run_state(recovered_dir, 4) == (league, adapters, rows)


def test_a_recovery_names_only_the_actor_that_died_while_the_learners_are_busy(ray_session, tmp_path):
    """The engine SIGKILLed while step 2 trains and step 3 is generated (no drain before step 4), with the teacher
    learner unable to answer meanwhile (SIGSTOPped: a 7B update keeps a learner busy for minutes): the recovery
    reads who died from Ray's actor table, so its record names the engine alone, and the run finishes."""
    from actors.driver import train

    run_dir = tmp_path / "run"
    config = load_config(None, [*SHORT, *OVERLAP, "run.steps=3", "run.checkpoint_every=3", "evolution.enabled=false",
                                f"run.run_dir={run_dir}"])
    paused: list[int] = []
    done = threading.Event()

    def fault() -> None:
        run = RunDirectory(run_dir)
        while not done.is_set() and not any(r["step"] == 1 for r in run.read_metrics()):
            time.sleep(0.02)
        pids = {i["Name"]: i["Pid"] for i in ray._private.state.actors().values() if i["State"] == "ALIVE"}
        if done.is_set() or not {"learner-teacher", "inference"} <= set(pids):
            return
        os.kill(pids["learner-teacher"], signal.SIGSTOP)
        paused.append(pids["learner-teacher"])
        os.kill(pids["inference"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not run.read_events("recovery") and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            os.kill(pids["learner-teacher"], signal.SIGCONT)  # in case the recovery has not killed it by now
        except ProcessLookupError:
            pass

    thread = threading.Thread(target=fault, daemon=True)
    thread.start()
    try:
        assert train(config, output="quiet") == 0
    finally:
        done.set()
        thread.join()
    assert paused, "the faults were never injected"
    events = RunDirectory(run_dir).read_events("recovery")
    assert len(events) == 1 and events[0]["actors"] == ["inference"], events
    assert [r["step"] for r in RunDirectory(run_dir).read_metrics()] == [1, 2, 3]
