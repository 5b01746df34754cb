"""One traits record per inference engine (``configs.engines``): a backend registered in that one place is validated
by the config and planned by the planners, which read its traits and never its name."""

from __future__ import annotations

import pytest

from configs import load_config
from configs.engines import ENGINES, EngineTraits, planned_engine
from configs.schema import Config
from planning.placement import plan_placement
from planning.time_plan import lengths_from_config, step_workload

TOY = EngineTraits("toy", "toy engine", budgeted_memory=False, sleep_mode=False, prefix_cache=True,
                   tensor_parallel=False, own_time_constants=True)


def test_an_unregistered_backend_is_a_config_error_listing_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown inference backend 'tgi'; registered: auto, hf, vllm"):
        Config.model_validate({"inference": {"backend": "tgi"}})
    assert planned_engine("auto", on_gpus=True).name == "vllm" and planned_engine("auto", on_gpus=False).name == "hf"


def test_a_toy_engine_registered_in_one_place_is_validated_and_planned(monkeypatch):
    monkeypatch.setitem(ENGINES, "toy", TOY)
    config = load_config(None, ["inference.backend=toy", "resources.inference_gpus=1", "resources.learner_gpus=1"])
    plan = plan_placement(config)
    assert "toy engine, every adapter" in plan.by_role("inference")[0].note  # its label, no tensor-parallel size
    lengths = lengths_from_config(config)
    shared, unshared = step_workload(config, lengths, prefix_sharing=True), step_workload(config, lengths, prefix_sharing=False)
    assert shared.solve_tokens[0] < unshared.solve_tokens[0]  # a prefix cache computes a prompt once for its n samples
    with pytest.raises(ValueError, match="only vllm does"):  # no tensor parallelism: refused, naming who has it
        load_config(None, ["inference.backend=toy", "resources.inference_gpus=2", "resources.tensor_parallel_size=2"])
