"""Placement planner: GPU layout for the paper's node, CPU layout for the tiny run, cluster checks."""

from __future__ import annotations

import pytest

from planning.placement import ClusterView, plan_placement
from configs import PRESETS_DIR, load_config


@pytest.fixture
def paper(monkeypatch):
    monkeypatch.setenv("POPULORA_MODEL", "/models/qwen")
    return load_config(PRESETS_DIR / "qwen2.5-7b-4t4s.yaml")


def test_paper_plan_uses_each_of_eight_gpus(paper):
    plan = plan_placement(paper)
    inference = plan.by_role("inference")
    assert sum(a.num_gpus for a in inference) == paper.resources.inference_gpus
    used = [g for a in inference for g in a.gpu_ids]
    learners = [a for a in plan.actors if a.role.startswith("learner")]
    learner_gpus = sorted({g for a in learners for g in a.gpu_ids})
    assert sorted(used + learner_gpus) == list(range(8))
    assert not set(used) & set(learner_gpus)
    for gpu in learner_gpus:  # the teacher and the student learner share each learner GPU's base
        sharing = [a for a in learners if a.gpu_ids == (gpu,)]
        assert sorted(a.role for a in sharing) == ["learner-student", "learner-teacher"]
        assert sum(a.num_gpus for a in sharing) == pytest.approx(1.0)
    assert plan.totals()["GPU"] == 8


def test_paper_plan_fits_an_eight_gpu_node_with_verifier_workers(paper):
    plan = plan_placement(paper)
    head = {"CPU": 96.0, "GPU": 8.0}
    workers = [{"CPU": 32.0, "verifier": 8.0} for _ in range(4)]
    ok, lines = plan.check(ClusterView({"CPU": 96 + 128.0, "GPU": 8.0, "verifier": 32.0}, [head, *workers], "test"))
    assert ok, lines
    verifiers = plan.by_role("verifier")
    assert len(verifiers) == paper.verifier.actors
    assert all(a.resources == {"verifier": 1.0} and a.num_gpus == 0 for a in verifiers)


def test_missing_gpus_and_verifier_fallback_are_reported(paper):
    ok, lines = plan_placement(paper).check(ClusterView({"CPU": 2.0}, [{"CPU": 2.0}], "laptop"))
    assert not ok
    assert any("fall back to the head" in line for line in lines)
    assert any(line.startswith("GPU: need 8") and "NOT ENOUGH" in line for line in lines)


def test_gpus_split_over_two_nodes_do_not_fit_one_node_layout(paper):
    nodes = [{"CPU": 200.0, "GPU": 4.0}, {"CPU": 200.0, "GPU": 4.0}]
    ok, lines = plan_placement(paper).check(ClusterView({"CPU": 400.0, "GPU": 8.0}, nodes, "two nodes"))
    assert not ok and any("largest node has 4" in line for line in lines)


def test_tiny_plan_is_cpu_only_and_fits_two_cores():
    config = load_config()
    plan = plan_placement(config)
    assert plan.totals()["GPU"] == 0
    names = [a.name for a in plan.actors]
    assert names[:3] == ["inference", "learner-teacher", "learner-student"]
    assert names[-1] == "league"
    ok, lines = plan.check(ClusterView({"CPU": 2.0}, [{"CPU": 2.0}], "laptop"))
    assert ok, lines


def test_single_agent_has_one_learner():
    plan = plan_placement(load_config(PRESETS_DIR / "tiny-single.yaml"))
    assert [a.name for a in plan.actors if a.role.startswith("learner")] == ["learner-agent"]


def test_tensor_parallel_replicas(paper):
    config = paper.model_copy(update={"resources": paper.resources.model_copy(update={"tensor_parallel_size": 2})})
    inference = plan_placement(config).by_role("inference")
    assert [a.gpu_ids for a in inference] == [(0, 1), (2, 3)]  # the preset's 4 inference GPUs: two tp-2 replicas
