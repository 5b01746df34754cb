"""The colocated layout (``resources.colocated``): every GPU holds an engine replica and a learner pair, the phases
taking it in turn. Its config errors, its placement (pure, and on a Ray cluster of logical GPUs), the colocated memory
plan (the engine's budget, a GPU's two moments, what vLLM's sleep mode frees and where the weights go), its time plan,
and a short real run on CPU. The CUDA path (vLLM sleeping beside the learners) is one GPU test, skipped here; the
engines' sleep mode off on CPU (said so) is checked in tests/test_engines.py, on an engine started there anyway."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from configs import PRESETS_DIR, load_config
from planning.memory_plan import (CUDA_CONTEXT_BYTES, CUDA_GRAPHS_BYTES, DTYPE_BYTES, RELEASE_RETAINED_FRACTION, GiB,
                                  HostView, LearnerShape, ModelDims, lora_params, plan_memory, step_peak_bytes)
from planning.placement import ClusterView, plan_placement
from planning.run_plan import plan_run
from planning.time_plan import COLOCATED_NOT_RUN, cluster_of, config_layout

from bench import qwen25_7b  # Qwen2.5-7B's config.json, the plan's 7B shape

DIMS = ModelDims.from_config_json(qwen25_7b.CONFIG)
HOST = HostView(ram_bytes=1024 * GiB, shm_bytes=512 * GiB)
COLOCATED_8 = ["resources.colocated=true", "run.max_staleness=0", "resources.inference_gpus=8", "resources.learner_gpus=8",
               "inference.vllm_engine_args.gpu_memory_utilization=0.64", "inference.vllm_engine_args.max_num_seqs=190",
               "rl.micro_batch_tokens=16384", "rl.data_parallel=false"]  # what fits one node of 8 x 80 GiB (docs/memory.md)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def qwen7b(tmp_path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(qwen25_7b.CONFIG))
    return tmp_path


def preset(model_dir: Path, *overrides: str):
    return load_config(PRESETS_DIR / "qwen2.5-7b-4t4s.yaml", [f"model.path={model_dir}", *overrides])


@pytest.mark.parametrize("overrides, named", [
    (["resources.colocated=true", "resources.inference_gpus=8", "resources.learner_gpus=4"],
     ["resources.colocated", "resources.inference_gpus=8", "resources.learner_gpus=4"]),
    (["resources.colocated=true", "resources.inference_gpus=8", "resources.learner_gpus=8",
      "resources.tensor_parallel_size=2"], ["resources.colocated", "resources.tensor_parallel_size=2"]),
    (["resources.colocated=true", "run.max_staleness=1", "rl.importance_correction=tis", "resources.inference_gpus=2",
      "resources.learner_gpus=2"], ["run.max_staleness", "resources.colocated"]),
])
def test_colocated_layouts_that_cannot_run_are_refused_naming_the_keys(overrides, named):
    with pytest.raises(ValueError) as err:
        load_config(None, overrides)
    for key in named:
        assert key in str(err.value)


def test_the_engine_owns_its_sleep_mode_argument():
    from inference.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="enable_sleep_mode"):  # refused before vLLM is imported
        VLLMEngine("unused", max_adapters=1, max_lora_rank=8, engine_args={"enable_sleep_mode": True})


def test_every_gpu_holds_an_engine_and_a_learner_pair(qwen7b):
    config = preset(qwen7b, *COLOCATED_8)
    plan = plan_placement(config)
    assert plan.colocated and plan.learner_shards == 8
    for gpu in range(8):
        on_gpu = sorted((a.name, a.num_gpus) for a in plan.actors if a.gpu_ids == (gpu,))
        assert on_gpu == [(f"inference-{gpu}", 0.5), (f"learner-student-{gpu}", 0.25), (f"learner-teacher-{gpu}", 0.25)]
        assert plan.gpu_bundle(gpu) == {"GPU": 1.0, "CPU": 12.0}  # the engine's 4 CPUs and each learner's 4
    assert all(plan.shares_gpu(a) for a in plan.actors if a.gpu_ids)
    assert plan.totals()["GPU"] == 8
    ok, lines = plan.check(ClusterView({"CPU": 512.0, "GPU": 8.0}, [{"CPU": 512.0, "GPU": 8.0}], "an 8-GPU node"))
    assert ok, lines
    single = plan_placement(load_config(PRESETS_DIR / "qwen2.5-7b-single.yaml", [
        f"model.path={qwen7b}", "resources.colocated=true", "run.max_staleness=0"]))
    assert [(a.name, a.num_gpus, a.gpu_ids) for a in single.actors if a.gpu_ids] == [
        ("inference", 0.5, (0,)), ("learner-agent", 0.5, (0,))]
    split = plan_placement(preset(qwen7b))  # the preset's 5+3: engines and learner pairs on separate GPUs
    assert not split.colocated and not any(split.shares_gpu(a) for a in split.by_role("inference"))
    cpu = plan_placement(load_config(None, ["resources.colocated=true"]))  # on CPU: the layout a laptop has anyway
    assert not cpu.colocated and [a.name for a in cpu.actors] == [a.name for a in plan_placement(load_config()).actors]


def test_colocated_memory_plan_counts_both_moments_of_every_gpu(qwen7b):
    config = preset(qwen7b, *COLOCATED_8)
    cap = 80 * GiB
    plan = plan_memory(config, DIMS, plan_placement(config), cap, HOST)
    assert plan.fits, plan.verdict()
    assert [r.device for r in plan.rows[:3]] == ["GPU 0 engine", "GPU 0 generating", "GPU 0 training"]
    rows = {r.device: r for r in plan.rows}
    base = DIMS.base_params() * DTYPE_BYTES["bfloat16"]
    p = lora_params(DIMS, 64, config.lora.target_modules)
    step = step_peak_bytes(DIMS, LearnerShape(slots=1, rank=64, targets=tuple(config.lora.target_modules), dtype_bytes=2,
                                              micro_batch_tokens=16384, max_seq_len=8192, checkpointing=True,
                                              logit_chunk_tokens=1024))
    # awake: the engine's whole budget (vLLM fills it with KV cache) + its context; the learners' base, 12 B per
    # adapter parameter (fp32 weights and AdamW moments: gradients are freed), the measured share of each learner's
    # step its released cache keeps, and two contexts
    learner = 12 * p + int(RELEASE_RETAINED_FRACTION * step)
    assert rows["GPU 3 generating"].need == int(0.64 * cap) + base + 2 * learner + 3 * CUDA_CONTEXT_BYTES
    # asleep: the learners' peak (the split layout's learner row) + the engine's context and CUDA graphs
    split = preset(qwen7b, "rl.micro_batch_tokens=16384", "resources.inference_gpus=4", "resources.learner_gpus=4",
                   "rl.data_parallel=false")
    learners = next(r for r in plan_memory(split, DIMS, plan_placement(split), cap, HOST).rows if r.device == "GPU 4")
    assert rows["GPU 3 training"].need == learners.need + CUDA_CONTEXT_BYTES + CUDA_GRAPHS_BYTES
    assert rows["GPU 3 engine"].capacity == int(0.64 * cap)
    # the weights and LoRA slots of every sleeping engine go to pinned host RAM: reported where this is not the GPU node
    pinned = rows["host RAM"]
    assert len(pinned.items) == 9 and not pinned.checked
    engine_state = base + 8 * lora_params(DIMS, 64, config.lora.target_modules) * 2
    assert pinned.need == 8 * engine_state + base  # and the shared base file in /dev/shm, RAM too
    small_gpu_node = plan_memory(config, DIMS, plan_placement(config), cap, HostView(64 * GiB, 64 * GiB, gpu_node=True))
    assert not small_gpu_node.fits and "host RAM" in small_gpu_node.verdict()
    eager = preset(qwen7b, *COLOCATED_8, "inference.vllm_engine_args.enforce_eager=true")
    eager_rows = {r.device: r for r in plan_memory(eager, DIMS, plan_placement(eager), cap, HOST).rows}
    assert eager_rows["GPU 3 training"].need == learners.need + CUDA_CONTEXT_BYTES


def test_an_engine_budget_too_large_for_its_gpus_learners_names_the_knob(qwen7b):
    config = preset(qwen7b, *COLOCATED_8, "inference.vllm_engine_args.gpu_memory_utilization=0.85",
                    "inference.vllm_engine_args.max_num_seqs=96")
    plan = plan_memory(config, DIMS, plan_placement(config), 80 * GiB, HOST)
    verdict = plan.verdict()
    assert not plan.fits and "GPU 0-7 generating" in verdict and "training" not in verdict
    assert "lower inference.vllm_engine_args.gpu_memory_utilization to at most 0." in verdict
    cpu = load_config(None, ["resources.colocated=true"])
    host = plan_memory(cpu, DIMS, plan_placement(cpu), 80 * GiB, HOST).rows[-1]
    assert host.device == "host RAM" and "no sleep mode" in host.note


def test_the_time_plan_plans_the_colocated_layout_but_does_not_recommend_it_yet(qwen7b):
    config = preset(qwen7b, *COLOCATED_8)
    assert config_layout(config).colocated and cluster_of(config).gpus == 8
    view = ClusterView({"CPU": 2.0}, [{"CPU": 2.0}], "laptop")
    run = plan_run(config, view, HOST)
    assert run.memory is not None and run.memory.fits and run.time_problem is None
    current = run.time.current
    assert current.layout.colocated and set(current.busy()) == {"gpus"}
    assert {p.name for p in current.phases} >= {"switch", "train", "solve"}
    why = {plan.name: why for plan, why in run.time.candidates}
    assert why["colocated 8 GPUs serial"] == COLOCATED_NOT_RUN and why["4+4 serial"] is None
    assert why["colocated 8 GPUs overlapped"].startswith("not runnable: overlap needs engines and learners on separate")
    assert run.time.recommended.name == "5+3 overlapped, data parallel"
    too_big = plan_run(preset(qwen7b, *COLOCATED_8[:4]), view, HOST)  # the preset's 0.85 x 80 GiB beside the learners
    assert dict((p.name, w) for p, w in too_big.time.candidates)["colocated 8 GPUs serial"].startswith(
        "memory: does not fit")


@pytest.mark.parametrize("run", [r for r in json.loads((ROOT / "tests" / "fixtures" / "colocated_measured.json").read_text())[
    "runs"] if r["allocator"] == "default"], ids=lambda r: f"{r['layers']}-layers")
def test_plan_holds_against_what_a_released_learner_keeps(run):
    """The H200 measurements of ``bench/colocated_memory.py``: what stays reserved after a learner's release is never
    over the plan's generating-row learner part, and the plan within 15% of it."""
    from bench.colocated_memory import planned as bench_planned

    planned = bench_planned(run["layers"], run["slots"], run["tokens"])["planned"]
    assert run["reserved"] <= planned <= 1.15 * run["reserved"], planned / run["reserved"]


@pytest.mark.gpu
@pytest.mark.vllm
def test_vllm_sleep_frees_the_gpu_and_wakes_with_its_adapters(tiny_qwen2, tmp_path):
    """CUDA only: a sleeping engine gives its weights and KV cache back, refuses work while asleep, and after waking
    generates what it generated before, with its adapter still applied (level 1 keeps the LoRA slots)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("vllm", reason="needs vLLM (gpu_check/check.py's machine has none)")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from inference import make_engine
    from inference.requests import GenerationRequest

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for key, param in model.named_parameters():
            if "lora_B" in key:
                param.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path / "a0")
    engine = make_engine("vllm", tiny_qwen2, max_adapters=1, max_lora_rank=8, max_model_len=128, sleep_mode=True,
                         engine_args={"gpu_memory_utilization": 0.3, "enforce_eager": True})
    try:
        engine.load_adapter("a0", tmp_path / "a0", version=1)
        requests = [GenerationRequest(adapter=a, prompt="def f(a):", temperature=0.0, max_tokens=8) for a in (None, "a0")]
        before = [out[0].token_ids for out in engine.generate(requests)]
        assert before[0] != before[1], "the adapter must change the output for the check to mean anything"
        free_awake = torch.cuda.mem_get_info()[0]
        assert engine.sleep() and engine.asleep
        assert torch.cuda.mem_get_info()[0] - free_awake > 0.2 * torch.cuda.mem_get_info()[1]  # the KV cache at least
        with pytest.raises(RuntimeError, match="asleep"):
            engine.generate(requests)
        assert engine.wake_up() and [out[0].token_ids for out in engine.generate(requests)] == before
    finally:
        engine.close()


@pytest.fixture(scope="module")
def logical_gpus():
    import ray

    from actors.cluster import NAMESPACE

    ray.init(address="local", num_cpus=4, num_gpus=2, namespace=NAMESPACE, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.mark.parametrize("overrides", [
    ["resources.inference_gpus=1", "resources.learner_gpus=1"],
    ["resources.colocated=true", "resources.inference_gpus=2", "resources.learner_gpus=2"],
])
def test_layouts_land_on_the_logical_gpus_they_plan(logical_gpus, overrides):
    """Each GPU actor of the plan started with its ``actor_options`` on a cluster of two logical GPUs: the actors
    planned on one GPU get the same Ray GPU, different planned GPUs different ones."""
    import ray

    from actors.cluster import actor_options
    from actors.system import close_and_kill

    @ray.remote
    class Where:
        def gpu_ids(self) -> list[int]:
            return [int(g) for g in ray.get_gpu_ids()]

    plan = plan_placement(load_config(None, ["resources.learner_cpus=0.5", "resources.inference_cpus=0.5", *overrides]))
    groups: dict = {}
    on_gpus = [a for a in plan.actors if a.gpu_ids]
    probes = [Where.options(**actor_options(plan, a, groups)).remote() for a in on_gpus]
    try:
        got = ray.get([p.gpu_ids.remote() for p in probes], timeout=60)
    finally:
        close_and_kill(probes, [], groups, [a.name for a in on_gpus])
    ray_gpu: dict[int, int] = {}
    for actor, ids in zip(on_gpus, got):
        assert len(ids) == 1, (actor.name, ids)
        assert ray_gpu.setdefault(actor.gpu_ids[0], ids[0]) == ids[0], (actor.name, ids, ray_gpu)
    assert len(set(ray_gpu.values())) == len(ray_gpu) == 2


def test_a_short_colocated_run_on_cpu(logical_gpus, tmp_path):
    """A step on the tiny test model with resources.colocated: the engines start before the learners, the loop
    sleeps and wakes them around the update (its seconds recorded as `switch`), and the driver says the engine has
    no sleep mode on CPU."""
    from short_runs import SHORT

    from actors.driver import train
    from reporting.run_dir import RunDirectory
    from tinycoder import ensure_model

    ensure_model("test", progress=False)
    config = load_config(None, SHORT + ["resources.colocated=true", "run.steps=1", "evolution.enabled=false",
                                        f"run.run_dir={tmp_path}"])
    assert train(config, output="quiet") == 0
    rows = RunDirectory(tmp_path).read_metrics()
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["phase_seconds"]["switch"] >= 0 and rows[0]["train"]
    log = (tmp_path / "logs" / "driver.log").read_text()
    assert "colocated, engine sleep mode off: " in log and "CUDA" in log
