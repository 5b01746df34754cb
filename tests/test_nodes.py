"""Several nodes on one machine: Ray's ``cluster_utils`` with logical GPUs, in the CPU stand-in mode
(``POPULORA_GPU_STANDIN=1``: actors given a logical GPU run their CPU path).

Placement of every layout on one node and on two (each GPU actor held where Ray puts it, with the options
``System`` gives it), a population stepping with its engine on one node and its learner pair on the other
(adapters crossing between the nodes' object stores), the shared base released on every node, and a node
that does not see the run's files named before any actor starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, remove_placement_group

from short_runs import SHORT
from standin_cluster import standin_cluster

from actors.cluster import (NAMESPACE, SharedPathError, actor_options, check_shared_paths,
                            reserve_gpus)
from configs import PRESETS_DIR, load_config
from actors.cluster_wait import live_view
from planning.placement import PlacementPlan, plan_placement

NODE = {"num_cpus": 4, "num_gpus": 2}  # logical: the machine has 2 cores and no GPU


@pytest.fixture(scope="module")
def cluster():
    """A one-node cluster (2 logical GPUs) in the stand-in mode; ``two_nodes`` adds the second."""
    with standin_cluster(NODE) as cluster:
        yield cluster


def two_nodes(cluster: Cluster) -> list[str]:
    """Add the second node of 2 logical GPUs (once); the node ids, head first."""
    if len(cluster.list_all_nodes()) < 2:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
    return [node.node_id for node in cluster.list_all_nodes()]


@ray.remote
def hold(name: str, reports: str, gate: str) -> tuple[str, tuple[str, tuple[str, ...]]]:
    """Report where this task landed (node, GPU ids), then hold its resources until ``gate`` exists."""
    where = (ray.get_runtime_context().get_node_id(), tuple(str(g) for g in ray.get_gpu_ids()))
    Path(reports, f"{name}.json").write_text(json.dumps(where))
    while not Path(gate).exists():
        time.sleep(0.02)
    return name, where


def place(plan: PlacementPlan, scratch: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Hold every GPU actor of ``plan`` at once, each with the resources and scheduling strategy ``System`` gives
    it (``reserve_gpus``, ``actor_options``; a task stands for the actor's body, which is not what is placed);
    where each landed."""
    scratch.mkdir(parents=True)
    groups: dict[int, object] = {}
    pinned = reserve_gpus(plan, groups)
    gpu_actors = [a for a in plan.actors if a.num_gpus]
    refs = []
    for actor in gpu_actors:
        options = actor_options(plan, actor, groups, pinned)
        task = {key: options[key] for key in ("num_cpus", "num_gpus", "scheduling_strategy") if key in options}
        refs.append(hold.options(**task).remote(actor.name, str(scratch), str(scratch / "go")))
    deadline = time.monotonic() + 60
    while len(list(scratch.glob("*.json"))) < len(refs):
        placed = {p.stem for p in scratch.glob("*.json")}
        assert time.monotonic() < deadline, f"not placed: {sorted({a.name for a in gpu_actors} - placed)}"
        time.sleep(0.05)
    (scratch / "go").touch()
    out = dict(ray.get(refs))
    for group in groups.values():
        remove_placement_group(group)
    assert {name: out[name][0] for name in pinned} == pinned, "a replica left the node reserved for it"
    return {name: (node, tuple(gpus)) for name, (node, gpus) in out.items()}


def check_layout(plan: PlacementPlan, placed: dict[str, tuple[str, tuple[str, ...]]]) -> set[str]:
    """Each replica holds its tp GPUs on one node, each learner GPU's actors share one node and one GPU, no
    physical (node, GPU) serves two of them; returns the nodes used."""
    units: dict[str, set[tuple[str, str]]] = {}
    for actor in plan.actors:
        if not actor.num_gpus:
            continue
        node, gpus = placed[actor.name]
        if actor.role == "inference":
            assert len(set(gpus)) == len(actor.gpu_ids), (actor.name, gpus)
            units[actor.name] = {(node, g) for g in gpus}
        else:
            assert len(gpus) == 1, (actor.name, gpus)
            key = f"learner GPU {actor.gpu_ids[0]}"
            assert units.setdefault(key, {(node, gpus[0])}) == {(node, gpus[0])}, f"{actor.name} left its pair's GPU"
    taken = [pair for unit in units.values() for pair in unit]
    assert len(taken) == len(set(taken)), f"a GPU serves two units: {units}"
    return {node for unit in units.values() for node, _ in unit}


def sized(inference: int, learners: int, tp: int = 1, preset: Path | None = None):
    # tensor parallelism is vLLM's: the tiny presets name the transformers engine, so tp > 1 plans the auto one
    backend = ["inference.backend=auto"] if tp > 1 else []
    return load_config(preset, [f"resources.inference_gpus={inference}", f"resources.learner_gpus={learners}",
                                f"resources.tensor_parallel_size={tp}", *backend])


def test_every_layout_is_placed_on_one_node_and_on_two(cluster, tmp_path):
    one_node = [sized(1, 1), sized(0, 2), sized(2, 0, tp=2), sized(1, 1, preset=PRESETS_DIR / "tiny-single.yaml")]
    for i, config in enumerate(one_node):
        plan = plan_placement(config)
        assert plan.check(live_view())[0]
        assert len(check_layout(plan, place(plan, tmp_path / f"one-{i}"))) == 1
    nodes = two_nodes(cluster)
    two = [sized(2, 2), sized(1, 3), sized(2, 2, tp=2), sized(4, 0, tp=2)]
    for i, config in enumerate(two):  # every layout takes the 4 GPUs of both nodes
        plan = plan_placement(config)
        assert plan.check(live_view())[0]
        assert check_layout(plan, place(plan, tmp_path / f"two-{i}")) == set(nodes), config.resources
    # an engine of 4 GPUs fits the cluster's total, not any node: refused before any actor starts
    ok, lines = plan_placement(sized(4, 0, tp=4)).check(live_view())
    assert not ok and any("need 4 GPUs on one node each" in line and "room for 0" in line for line in lines)


def test_a_population_steps_across_two_nodes_in_the_stand_in_mode(cluster):
    """The engine on one node, the learner pair on the other (one GPU of each node is taken beforehand), one step."""
    import torch

    from actors.driver import resolve_model
    from actors.loop import run_step
    from actors.system import System
    from learners.shared_base import base_dir_for
    from rollouts import StepPrompts

    nodes = two_nodes(cluster)
    filler = placement_group([{"GPU": 1.0}, {"GPU": 1.0}], strategy="STRICT_SPREAD")  # one GPU left on each node
    ray.get(filler.ready())
    config = load_config(None, [*SHORT, "resources.inference_gpus=1", "resources.learner_gpus=1", "verifier.actors=1",
                                "evolution.enabled=false", "population.teachers=1", "population.students=1"])
    model_path = resolve_model(config, progress=False)
    plan = plan_placement(config)
    system = System.start(config, plan, model_path)
    try:
        engine, = system.inference
        learners = system.flat_learners
        where = ray.get([engine.__ray_call__.remote(
            lambda self: (ray.get_runtime_context().get_node_id(), ray.get_gpu_ids(), str(self.engine.device)))] + [
            learner.__ray_call__.remote(lambda self: (ray.get_runtime_context().get_node_id(), ray.get_gpu_ids(),
                                                      str(next(self.model.parameters()).device)))
            for learner in learners])
        assert all(len(gpus) == 1 and device == "cpu" for _, gpus, device in where), where  # logical GPU, CPU path
        assert where[1][:2] == where[2][:2], "the teacher and the student learner share one node and one GPU"
        assert {where[0][0], where[1][0]} == set(nodes), "the engine and the learner pair on different nodes"
        system.publish_adapters(all_members=True)
        row, _ = run_step(system, 1, StepPrompts.from_config(config, model_path))
        assert row["step"] == 1 and row["phase_seconds"]["train"] > 0
        assert system.versions["t0"] >= 1, system.versions  # the teacher trained, its new version served
        system.check_versions()
    finally:
        released = system.stop()
        remove_placement_group(filler)
    assert sorted(released) == sorted(nodes), "the shared base is released on every node"
    assert not base_dir_for(model_path, torch.float32).exists()


JOIN_NODE = """
import sys, time
from ray._private.node import Node
from ray._private.parameter import RayParams

params = RayParams(gcs_address=sys.argv[1], node_ip_address=sys.argv[1].rsplit(":", 1)[0], num_cpus=1, num_gpus=0,
                   object_store_memory=150 * 2**20, min_worker_port=0, max_worker_port=0, include_log_monitor=False,
                   node_manager_port=0)
params.dashboard_agent_listen_port = None
Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
while True:
    time.sleep(1)
"""
"""A Ray node joining the cluster at argv[1], as ``cluster_utils.Cluster.add_node`` starts one (``ray start`` would
not join a loopback-only cluster), but in this process, so that it can run in a mount namespace of its own."""


def unshare_prefix() -> list[str] | None:
    """A command prefix that runs what follows in a private mount namespace, or None where this machine allows none."""
    if not shutil.which("unshare"):
        return None
    for prefix in (["unshare", "--mount", "--propagation", "private"], ["unshare", "--map-root-user", "--mount"]):
        if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    return None


def test_a_node_that_does_not_see_the_run_directory_or_the_model_is_named(cluster, tmp_path, capsys):
    """A third node started in its own mount namespace, where a tmpfs hides the shared directory holding the run
    directory and the model: the check names that node (IP and id) and both paths, and changes nothing of the run;
    a run there stops with exit code 2 before any actor starts."""
    from actors.driver import train

    prefix = unshare_prefix()
    if prefix is None:
        pytest.skip("no mount namespace can be made here (unshare), so no node can be given another file system")
    two_nodes(cluster)  # the check runs (one node that is the driver's own is skipped)
    shared = tmp_path / "shared"
    run_dir, model = shared / "run", shared / "model"
    (run_dir / "checkpoints" / "step-1").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    before = sorted((p.relative_to(run_dir), p.read_bytes() if p.is_file() else None) for p in run_dir.rglob("*"))
    assert sorted(check_shared_paths(run_dir, str(model))) == sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    log = tmp_path / "node.log"
    node = subprocess.Popen([*prefix, "sh", "-c", 'mount -t tmpfs tmpfs "$1" && exec "$2" -c "$3" "$4"', "sh", str(shared),
                             sys.executable, JOIN_NODE, cluster.address], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        known = {n["NodeID"] for n in ray.nodes()}
        deadline = time.monotonic() + 90
        while not (hidden := [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in known]):
            assert node.poll() is None and time.monotonic() < deadline, f"the node did not join: {log.read_text()[-2000:]}"
            time.sleep(0.5)
        with pytest.raises(SharedPathError) as caught:
            check_shared_paths(run_dir, str(model))
        message = str(caught.value)
        lines = [line for line in message.splitlines() if line.startswith("  node ")]
        assert len(lines) == 2 and all(f"(id {hidden[0]['NodeID'][:12]})" in line for line in lines), message
        assert f"cannot see the run directory {run_dir} (run.run_dir)" in lines[0]
        assert f"cannot see the model directory {model} (model.path)" in lines[1]
        assert hidden[0]["NodeManagerAddress"] in lines[0]
        capsys.readouterr()
        # a new run beside it (a fresh run into run_dir, which holds a run, is refused before this check)
        assert train(load_config(None, [*SHORT, f"run.run_dir={shared / 'new-run'}"]), output="quiet") == 2
        err = capsys.readouterr().err
        assert "error: not every node of the cluster sees the run's files" in err and hidden[0]["NodeID"][:12] in err
        assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]
    finally:
        try:
            os.killpg(node.pid, 9)  # the namespaced node and every process it started, nothing else
        except ProcessLookupError:  # it had stopped already
            pass
        node.wait()
    after = {p.relative_to(run_dir): p.read_bytes() if p.is_file() else None for p in run_dir.rglob("*")}
    assert [(path, after.get(path)) for path, _ in before] == before, "the run's files are as they were"
    assert not (run_dir / "status.json").exists() and not list(run_dir.glob(".populora-node-check*"))
