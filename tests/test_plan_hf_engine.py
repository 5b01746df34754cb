"""The one-GPU colocated tiny default: the transformers engine (``inference.backend: hf``) and the teacher and
student learners on one GPU, planned as it runs. The engine has no sleep mode: the memory plan counts its own weights,
float32 LoRA slots, KV cache, prefill and sampler in both moments of the GPU (no vLLM budget, no sleeping engine, no
pinned host copies), and the time plan gives it no sleep/wake switch. The GPUs are described (``plan.gpu_kind``), not
present: everything here is arithmetic, and runs in seconds on a CPU."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from configs import PRESETS_DIR, load_config
from planning.memory_plan import (CUDA_CONTEXT_BYTES, HF_MAX_BATCH_ROWS, GiB, HostView, hf_batch_rows, hf_engine_items,
                                  load_model_dims, lora_params)
from planning.placement import ClusterView, plan_placement
from planning.run_plan import plan_run
from planning.time_constants import DEVICE_KINDS

ROOT = Path(__file__).resolve().parents[1]
ONE_GPU = ["resources.colocated=true", "resources.inference_gpus=1", "resources.learner_gpus=1", "model.tiny_variant=test"]
LAPTOP = ClusterView({"CPU": 2.0}, [{"CPU": 2.0}], "laptop")  # no GPU here: the plan is for the described one
HOST = HostView(ram_bytes=64 * GiB, shm_bytes=32 * GiB)


def tiny(*overrides: str):
    return load_config(PRESETS_DIR / "tiny.yaml", [*ONE_GPU, *overrides])


def engine_bytes_by_hand(config) -> dict[str, int]:
    """The tiny ``test`` variant's transformers engine, counted here: hidden 128, 2 layers, 1 KV head of 64, float32."""
    dims = load_model_dims(config)
    assert (dims.hidden, dims.layers, dims.kv_heads, dims.dim) == (128, 2, 1, 64)
    rows = 2 * 6 * 4  # the solve call: 2 teachers x 6 proposals, every one valid, 4 rollouts each
    kv_token = 2 * 64 * 4 * 2  # K and V x kv width x float32 x layers = 1 KiB
    width = 1024 - 192  # the longest prompt that leaves room for inference.max_tokens
    return {
        "weights": dims.base_params() * 4,
        "LoRA slots": 4 * lora_params(dims, 8, config.lora.target_modules) * 4,  # 4 members, float32 masters
        "KV cache": rows * 1024 * kv_token * 3 // 2,  # + one of the 2 layers' copy while it grows
        "prefill": rows * width * (4 * 128 + 3 * dims.intermediate) * 4 + rows * width * width * 5,
        "sampler": rows * dims.vocab * 32,
        "CUDA context": CUDA_CONTEXT_BYTES,
    }


@pytest.mark.parametrize("kind", ["H100", "H200"])
def test_one_gpu_colocated_tiny_default_plans_the_engine_awake_in_both_moments(kind):
    config = tiny(f"plan.gpu_kind={kind}")
    run = plan_run(config, LAPTOP, HOST)
    memory = run.memory
    assert memory is not None and memory.fits, memory.verdict()
    assert f"the described {kind}" in memory.capacity_source
    rows = {r.device: r for r in memory.rows}
    assert list(rows) == ["GPU 0 generating", "GPU 0 training", "host /dev/shm"]  # no vLLM budget row, no pinned RAM
    assert all(r.capacity == int(DEVICE_KINDS[kind].memory_gib * GiB) for r in memory.rows[:2])
    expected = engine_bytes_by_hand(config)
    for moment in ("generating", "training"):
        row = rows[f"GPU 0 {moment}"]
        engine = {name.split(": ", 1)[1]: b for name, b in row.items.items() if name.startswith("inference (awake): ")}
        assert list(engine.values()) == list(expected.values()), moment
        assert all(name.startswith(part) for name, part in zip(engine, expected)), list(engine)
        assert not any("vLLM" in name or "asleep" in name or "pinned" in name for name in row.items), moment
        assert "awake" in row.note
    learners_only = sum(b for name, b in rows["GPU 0 training"].items.items() if not name.startswith("inference"))
    assert rows["GPU 0 training"].need == learners_only + sum(expected.values())
    time = run.time.current
    assert run.time_problem is None and time.engine == "hf"
    phases = {p.name: p for p in time.phases}
    assert phases["switch"].seconds == 0.0 and "no sleep mode" in phases["switch"].detail
    assert time.missing == [] and not any("sleep_wake_s" in m for m in time.missing)
    assert time.generation_lower_bound and f"the transformers engine on {kind}: generation planned at vLLM's rates" in (
        time.render())
    assert "lower bound" in run.time.verdict()


def test_the_same_gpu_with_vllm_keeps_its_budget_sleep_and_switch():
    """The contrast that makes the test above able to fail: vLLM's rows and switch are unchanged."""
    config = tiny("inference.backend=vllm", "plan.gpu_kind=H200")
    run = plan_run(config, LAPTOP, HOST)
    devices = [r.device for r in run.memory.rows]
    assert devices == ["GPU 0 engine", "GPU 0 generating", "GPU 0 training", "host /dev/shm", "host RAM"]
    assert any("asleep" in name for name in run.memory.rows[2].items)
    switch = {p.name: p.seconds for p in run.time.current.phases}["switch"]
    assert switch == DEVICE_KINDS["H200"].sleep_wake_s.value and run.time.current.engine == "vllm"
    auto = tiny("inference.backend=auto")  # auto is vLLM on GPUs (configs/schema.py)
    assert plan_run(auto, LAPTOP, HOST).memory.rows[0].device == "GPU 0 engine"


def test_a_split_layout_gives_the_engine_its_whole_gpu():
    config = load_config(PRESETS_DIR / "tiny.yaml", ["resources.inference_gpus=1", "resources.learner_gpus=1",
                                                     "model.tiny_variant=test"])
    memory = plan_run(config, LAPTOP, HOST).memory
    engine = memory.rows[0]
    assert engine.device == "GPU 0" and engine.capacity == 80 * GiB and "transformers engine" in engine.note
    assert engine.items == hf_engine_items(config, load_model_dims(config))
    assert "transformers engine" in plan_placement(config).by_role("inference")[0].note


def test_h200_is_a_device_kind_with_its_sources():
    h200, h100 = DEVICE_KINDS["H200"], DEVICE_KINDS["H100"]
    assert h200.peak_flops.value == h100.peak_flops.value == 989e12 and "H200 SXM datasheet" in h200.peak_flops.source
    assert h200.memory_bandwidth.value == 4.8e12 and "H200 SXM datasheet" in h200.memory_bandwidth.source
    assert 139 < h200.memory_gib < 141
    assert h200.train_mfu.measured and "calibrate" in h200.train_mfu.source and "H200" in h200.train_mfu.source
    for name in ("prefill_mfu", "decode_mfu", "lora_decode_overhead"):  # vLLM's: not measured on an H200 yet
        value = getattr(h200, name)
        assert value.value == getattr(h100, name).value and not value.measured, name
        assert "assumed equal to the H100" in value.source, name


@pytest.fixture
def launch(capsys, monkeypatch):
    """``launch.py --dry-run ARGS`` in this process (it starts nothing)."""
    monkeypatch.setenv("RAY_ADDRESS", "local")  # this machine, never a cluster running on it
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    import launch as launcher

    def run(*args: str) -> SimpleNamespace:
        capsys.readouterr()
        code = launcher.main(["--dry-run", *args])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return run


def test_the_dry_run_plans_the_one_gpu_layout_and_refuses_a_gpu_too_small(launch):
    fits = launch(*ONE_GPU, "plan.gpu_kind=H200")
    assert fits.returncode == 0, fits.stdout[-2000:] + fits.stderr
    assert "# time plan (1xH200, layout colocated 1 GPUs" in fits.stdout
    assert "stays awake beside this GPU's learners (no sleep mode)" in fits.stdout  # the placement says it too
    small = launch(*ONE_GPU, "resources.gpu_memory_gib=0.5")
    assert small.returncode == 1
    verdict = next(line for line in small.stdout.splitlines() if line.startswith("memory: does not fit"))
    assert "GPU 0 generating needs" in verdict and "of 512 MiB (" in verdict and " short): " in verdict
    assert "the rows the transformers engine decodes at once (48:" in verdict


def test_the_7b_preset_with_the_transformers_engine_does_not_fit_one_gpu(tmp_path):
    from bench import qwen25_7b

    (tmp_path / "config.json").write_text(json.dumps(qwen25_7b.CONFIG))
    config = load_config(PRESETS_DIR / "qwen2.5-7b-4t4s.yaml", [
        f"model.path={tmp_path}", "inference.backend=hf", "inference.vllm_engine_args={}", "run.max_staleness=0",
        "rl.data_parallel=false", "plan.gpu_kind=H200", *ONE_GPU[:3]])
    memory = plan_run(config, LAPTOP, HOST).memory
    assert not memory.fits
    verdict = memory.verdict()
    assert "GPU 0 generating needs" in verdict and "of 139.8 GiB (" in verdict and "GiB short)" in verdict
    assert hf_batch_rows(config) == HF_MAX_BATCH_ROWS  # the engine's cap, not the step's calls, bounds its batch


def test_the_plans_batch_cap_is_the_engines():
    """The plan's row cap is the one ``HFEngine`` applies, and the inference actor does not change it."""
    from inference.hf_engine import HFEngine

    assert inspect.signature(HFEngine.__init__).parameters["max_batch_rows"].default == HF_MAX_BATCH_ROWS
    assert "max_batch_rows" not in (ROOT / "actors" / "inference_actor.py").read_text()
