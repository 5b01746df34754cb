"""cluster.yaml is a valid Ray cluster-launcher file (Ray's own schema) with the promised node types."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


def load() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_schema():
    config = prepare_config(load())  # fills Ray's provider defaults, as `ray up` does
    validate_config(config)  # jsonschema against ray/autoscaler/ray-schema.json + Ray's own checks


def test_head_has_eight_gpus_and_workers_carry_the_verifier_resource_or_gpus():
    config = load()
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"]["GPU"] == 8
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    verifiers = [t for t in workers.values() if t["resources"].get("verifier", 0) > 0]
    gpus = [t for t in workers.values() if t["resources"].get("GPU", 0) > 0]
    assert verifiers and all(not t["resources"].get("GPU") for t in verifiers)
    assert any(t["max_workers"] > t.get("min_workers", 0) for t in verifiers)  # they autoscale
    # a GPU worker type for one population across several nodes: no verifier resource, the GPU install
    assert gpus and all(t["resources"]["GPU"] == 8 and t["resources"].get("verifier", 0) == 0 for t in gpus)
    assert all(any("install.sh gpu" in c for c in t["worker_setup_commands"]) for t in gpus)
    assert config["max_workers"] >= sum(t["max_workers"] for t in workers.values())


def test_setup_commands_install_the_project():
    config = load()
    assert any("install.sh gpu" in c for c in config["head_setup_commands"])
    assert any("install.sh cpu" in c for c in config["worker_setup_commands"])


def test_every_node_starts_ray_with_the_subreaper_and_no_idle_workers():
    """Ray kills what a dead worker left behind (a GPU engine's vLLM engine core has no parent-death check), and no
    raylet starts idle workers for tasks the run never submits (the settings a local cluster gets)."""
    from actors.cluster import NO_IDLE_WORKERS_ENV

    config = load()
    for commands in (config["head_start_ray_commands"], config["worker_start_ray_commands"]):
        start = next(c for c in commands if "ray start" in c)
        env = dict(word.split("=", 1) for word in start.split("ray start")[0].split(";")[-1].split())
        assert env["RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper"] == "true"
        assert NO_IDLE_WORKERS_ENV.items() <= env.items()


PLAN_NUMBERS = re.compile(
    r"~?\d+(\.\d+)? s\b|\d+ ?% busy|the plan's \d+|"
    r"\b(one|two|three|four|five|six|seven|eight|\d+) (vllm |inference |engine )*(replicas|learner gpus)", re.I)
"""What the planner computes, quoted: seconds, busy shares, its max_num_seqs, replica and learner GPU counts."""


def test_no_comment_of_cluster_yaml_or_a_preset_quotes_a_number_the_planner_computes():
    """Numbers the plan computes change with the planner and its constants: the comments point at the dry run that
    prints them instead (the README's quoted ones are checked against it, tests/test_readme.py)."""
    found = []
    for path in [ROOT / "cluster.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            comment = line.partition("#")[2]
            if PLAN_NUMBERS.search(comment):
                found.append(f"{path.name}:{number}: {comment.strip()}")
    assert not found, found
