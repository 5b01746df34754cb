"""A node lost mid-run, on Ray's ``cluster_utils`` in the CPU stand-in mode (logical GPUs, CPU paths).

The cluster: a head with CPUs only and two nodes of one logical GPU each, the engine on one and the learner pair on
the other (``resources.inference_gpus=1 resources.learner_gpus=1``). One run of 3 steps loses, in turn:

1. the node holding the engine, after step 1, and a replacement joins 3 s later: the recovery names the lost
   node, waits for it, and goes on by itself;
2. the node holding the learner pair, after step 2, and nothing joins: within ``run.cluster_wait_s`` the run stops
   cleanly (exit 1, status ``failed`` with a cause naming the lost node and the GPU short, no actor or placement
   group left, the latest checkpoint complete).

A node then joins and ``resume`` finishes the run: each step once in metrics.jsonl, the league and the adapters
equal to a fault-free run's.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import ray

from reporting.run_dir import comparable_state as run_state
from short_runs import SHORT
from standin_cluster import standin_cluster

from configs import load_config
from learners.shared_base_paths import default_shm_dir
from reporting.run_dir import RunDirectory

STEPS = 3
BOUND_S = 15
OVERRIDES = [*SHORT, "resources.inference_gpus=1", "resources.learner_gpus=1", "population.teachers=1",
             "population.students=1", "evolution.enabled=false", f"run.cluster_wait_s={BOUND_S}"]
GPU_NODE = {"num_cpus": 1, "num_gpus": 1}
CLASSES = {"LearnerActor", "InferenceActor", "LeagueActor", "VerifierActor"}


@pytest.fixture(scope="module")
def cluster():
    """The cluster; at the end, what the lost nodes' engines left in /dev/shm is removed (a lost machine takes its
    /dev/shm with it; these nodes share this machine's)."""
    from tinycoder import ensure_model

    ensure_model("test", progress=False)
    shm = default_shm_dir()
    before = set(shm.iterdir())
    try:
        with standin_cluster({"num_cpus": 4, "num_gpus": 0}, (GPU_NODE, GPU_NODE)) as cluster:
            yield cluster
    finally:
        for path in set(shm.iterdir()) - before:
            if path.name.startswith("populora-adapters-") or path.name.startswith("populora-incoming-"):
                shutil.rmtree(path, ignore_errors=True)


def node_of(name: str) -> str | None:
    """The node id of the live actor of ours named ``name`` (GCS actor table)."""
    for info in ray._private.state.actors().values():
        if info["Name"] == name and info["State"] == "ALIVE":
            return info["Address"]["NodeID"]
    return None


def config_for(run_dir: Path, *extra: str):
    return load_config(None, [*OVERRIDES, f"run.run_dir={run_dir}", *extra])


def test_a_lost_node_is_waited_for_then_the_run_stops_cleanly_and_resumes_equal(cluster, tmp_path, capfd):
    from actors.driver import train

    reference = tmp_path / "reference"
    assert train(config_for(reference, f"run.steps={STEPS}"), output="quiet") == 0
    capfd.readouterr()

    run_dir = tmp_path / "faulty"
    lost: dict[str, str] = {}
    done = threading.Event()

    on_node: dict[str, set[str]] = {}  # the stateful actors of ours on each lost node

    def remove_node_of(actor: str) -> None:
        node_id = node_of(actor)
        node, = [n for n in cluster.list_all_nodes() if n.node_id == node_id]
        lost[actor] = node_id
        on_node[actor] = {i["Name"] for i in ray._private.state.actors().values() if i["State"] == "ALIVE"
                          and i["ActorClassName"] in CLASSES - {"VerifierActor"} and i["Address"]["NodeID"] == node_id}
        cluster.remove_node(node)

    result: dict[str, int] = {}

    def run_it() -> None:  # the run in a thread: cluster_utils adds nodes only from the main thread
        try:
            result["code"] = train(config_for(run_dir, f"run.steps={STEPS}"))
        finally:
            done.set()

    thread = threading.Thread(target=run_it, daemon=True)
    started = time.monotonic()
    thread.start()
    # the engine's node after step 1 (a node joins 3 s later), the learners' after step 2 (none joins)
    for step, actor, joins in ((1, "inference", True), (2, "learner-teacher", False)):
        while not done.is_set() and not any(r["step"] == step for r in RunDirectory(run_dir).read_metrics()):
            time.sleep(0.05)
        if done.is_set():
            break
        remove_node_of(actor)
        if joins:
            time.sleep(3)
            cluster.add_node(**GPU_NODE)
    thread.join(timeout=300)
    code = result.get("code")
    out, err = capfd.readouterr()
    assert set(lost) == {"inference", "learner-teacher"}, lost
    assert code == 1, err[-3000:]
    assert time.monotonic() - started < 240

    # the first loss was recovered by itself; the second stopped cleanly, naming the node and what is short
    run = RunDirectory(run_dir)
    recoveries = [e for e in run.read_events() if e["event"] == "recovery"]
    # the recovery names exactly the actors that were on the lost node (the league may share the engine's)
    assert set(recoveries[0]["actors"]) == on_node["inference"] and "inference" in on_node["inference"], recoveries
    assert recoveries[0]["restored_step"] is not None, recoveries
    assert recoveries[-1]["restored_step"] is None and "ClusterWaitError" in recoveries[-1]["attempt_error"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed", status
    lost_learner_node = lost["learner-teacher"][:8]
    assert lost_learner_node in status["cause"] and "left the cluster" in status["cause"], status["cause"]
    assert "GPU: need 2, have 1 (NOT ENOUGH)" in status["cause"] and "run.cluster_wait_s=15" in status["cause"]
    assert f"node {lost['inference'][:8]}" in err and "waiting up to 15 s" in err, err[-3000:]
    assert f"resume with: python launch.py --resume {run_dir}" in err
    assert "Traceback" not in err
    # nothing left: no actor of ours alive or pending, no placement group but removed ones
    assert not [i["Name"] for i in ray._private.state.actors().values()
                if i["ActorClassName"] in CLASSES and i["State"] != "DEAD"]
    assert {g["state"] for g in ray.util.placement_group_table().values()} <= {"REMOVED"}
    checkpoint, notes = run.find_checkpoint()
    assert checkpoint is not None and not notes, notes

    # room again: resume finishes the run, equal to the fault-free one
    cluster.add_node(**GPU_NODE)
    cluster.wait_for_nodes()
    restored = int(checkpoint.name.split("-")[1])
    assert restored < STEPS
    assert train(config_for(run_dir, f"run.steps={STEPS}"), resume=True, output="quiet") == 0  # to its planned last step
    league, adapters, rows = run_state(run_dir, STEPS)
    ref_league, ref_adapters, ref_rows = run_state(reference, STEPS)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows == ref_rows
    assert league == ref_league
    assert adapters == ref_adapters and adapters
