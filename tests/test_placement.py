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


def test_the_paper_layout_fits_two_nodes_of_four_gpus(paper):
    nodes = [{"CPU": 200.0, "GPU": 4.0}, {"CPU": 200.0, "GPU": 4.0}]
    ok, lines = plan_placement(paper).check(ClusterView({"CPU": 400.0, "GPU": 8.0}, nodes, "two nodes"))
    assert ok, lines
    assert any(line.startswith("GPU per node:") and "2 GPU nodes (4, 4 GPUs)" in line and "(ok)" in line for line in lines)


def layout(paper, inference: int, learners: int, tp: int = 1):
    return paper.model_copy(update={"resources": paper.resources.model_copy(update={
        "inference_gpus": inference, "learner_gpus": learners, "tensor_parallel_size": tp})})


@pytest.mark.parametrize("node_gpus", [[8.0], [4.0, 4.0], [2.0, 2.0, 2.0, 2.0]], ids=["one node", "two nodes", "four nodes"])
def test_every_split_of_eight_gpus_fits_one_node_or_several(paper, node_gpus):
    nodes = [{"CPU": 200.0, "GPU": g} for g in node_gpus]
    view = ClusterView({"CPU": 200.0 * len(nodes), "GPU": 8.0}, nodes, "test")
    for tp in (1, 2):
        for inference in range(0, 9, tp):
            ok, lines = plan_placement(layout(paper, inference, 8 - inference, tp)).check(view)
            assert ok, (inference, tp, lines)


def test_an_engine_wider_than_every_node_does_not_fit(paper):
    """Two replicas of tensor_parallel_size 4 on four nodes of 2 GPUs: 8 GPUs in all, none holds a replica."""
    nodes = [{"CPU": 200.0, "GPU": 2.0} for _ in range(4)]
    plan = plan_placement(layout(paper, 8, 0, 4))
    ok, lines = plan.check(ClusterView({"CPU": 800.0, "GPU": 8.0}, nodes, "four nodes"))
    assert not ok
    short = [line for line in lines if "NOT ENOUGH" in line]
    assert len(short) == 1 and "2 engine replicas of tensor_parallel_size 4 need 4 GPUs on one node each" in short[0]
    assert "4 GPU nodes (2, 2, 2, 2 GPUs): room for 0" in short[0]
    # one node of 4 more holds one of them, not both
    ok, lines = plan.check(ClusterView({"CPU": 1000.0, "GPU": 12.0}, nodes + [{"CPU": 200.0, "GPU": 4.0}], "five"))
    assert not ok and any("room for 1 (NOT ENOUGH)" in line for line in lines)


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
