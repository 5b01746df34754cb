"""The memory plan: the 7B arithmetic, the derivation of saved activations, fit and refusal, the dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from planning.memory_plan import (
    GiB,
    HostView,
    LearnerShape,
    ModelDims,
    PlanInputError,
    kv_bytes_per_token,
    layer_saved_bytes,
    learner_components,
    load_model_dims,
    lora_params,
    paged_kv,
    plan_memory,
    with_resolved_checkpointing,
)
from planning.lengths import Lengths
from planning.placement import plan_placement
from configs import PRESETS_DIR, load_config

ROOT = Path(__file__).resolve().parents[1]
QWEN25_7B_CONFIG = {  # Qwen2.5-7B's public config.json (the fields the plan reads and a few more)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
HOST = HostView(ram_bytes=1024 * GiB, shm_bytes=512 * GiB)


@pytest.fixture
def qwen7b_dir(tmp_path) -> Path:
    """A directory holding only Qwen2.5-7B's config.json (no weights, no tokenizer)."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B_CONFIG))
    return tmp_path


def preset(name: str, model_dir: Path, *overrides: str):
    return load_config(PRESETS_DIR / name, [f"model.path={model_dir}", *overrides])


def plan_of(config, gpu_gib: float = 80.0):
    return plan_memory(config, load_model_dims(config), plan_placement(config), int(gpu_gib * GiB), HOST)


def test_7b_arithmetic_matches_the_reference_numbers(qwen7b_dir):
    dims = load_model_dims(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir))
    assert dims.dim == 128 and dims.kv == 512
    assert dims.base_params() == pytest.approx(7.6e9, rel=0.01)  # 15.2 GB in bfloat16
    assert lora_params(dims, 64, list(dims.module_widths())) == 64 * 2_523_136 == 161_480_704
    assert kv_bytes_per_token(dims, 2) == 2 * 4 * 128 * 2 * 28 == 57_344


@pytest.mark.parametrize("name", ["qwen2.5-7b-4t4s.yaml", "qwen2.5-7b-instruct-4t4s.yaml", "qwen2.5-7b-single.yaml"])
def test_each_7b_presets_max_num_seqs_is_the_plans_choice(qwen7b_dir, name):
    """The presets set ``max_num_seqs`` to what the memory plan chooses for them on 80 GiB (their comments say so)."""
    config = preset(name, qwen7b_dir)
    assert config.inference.vllm_engine_args["max_num_seqs"] == plan_of(config).kv.chosen


def test_learner_state_is_sixteen_bytes_per_adapter_parameter(qwen7b_dir):
    dims = load_model_dims(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir))
    shape = LearnerShape(slots=2, rank=64, targets=tuple(dims.module_widths()), dtype_bytes=2, micro_batch_tokens=1024,
                         max_seq_len=1024, checkpointing=True, logit_chunk_tokens=1024)
    parts = learner_components(dims, shape)
    assert parts["adapters (fp32 weights, AdamW moments)"] + parts["adapter gradients (fp32)"] == 16 * 161_480_704 * 2


def test_checkpointing_and_chunking_shrink_the_peak(qwen7b_dir):
    dims = load_model_dims(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir))
    kw = dict(slots=2, rank=64, targets=tuple(dims.module_widths()), dtype_bytes=2, micro_batch_tokens=16384, max_seq_len=8192)
    act = "activations + logits (policy pass)"
    plain = learner_components(dims, LearnerShape(**kw, checkpointing=False, logit_chunk_tokens=0))[act]
    ckpt = learner_components(dims, LearnerShape(**kw, checkpointing=True, logit_chunk_tokens=0))[act]
    both = learner_components(dims, LearnerShape(**kw, checkpointing=True, logit_chunk_tokens=1024))[act]
    assert ckpt < plain / 3 and both < ckpt / 2
    assert plain > 100 * GiB and both < 16 * GiB  # tens of GB per 8k-token sample without either (the arithmetic)


def _saved_bytes_per_layer(dtype, padded: bool) -> tuple[dict[str, int], int]:
    """Bytes autograd saves in each decoder layer of the learners' real model (saved-tensor hooks, by storage)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learners.multi_lora import LoRASpec, MultiLoRAModel

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=256, intermediate_size=1152, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).to(dtype)
    mlm = MultiLoRAModel(model, LoRASpec(rank=16, alpha=16, num_slots=2))
    ids = torch.randint(0, 1000, (2, 128))
    mask = torch.ones(2, 128, dtype=torch.long)
    if padded:
        mask[1, -10:] = 0
    params = {p.untyped_storage().data_ptr() for p in mlm.parameters()}
    where = ["outside"]
    seen: dict[int, tuple[str, int]] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in seen:
            seen[key] = (where[0], t.untyped_storage().nbytes())
        return t

    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda *_, i=i: where.__setitem__(0, f"layer{i}"))
        layer.register_forward_hook(lambda *_: where.__setitem__(0, "outside"))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mlm.set_adapter_index([0, 1])
        model.model(input_ids=ids, attention_mask=mask, use_cache=False)
    total: dict[str, int] = defaultdict(int)
    for place, nbytes in seen.values():
        total[place] += nbytes
    return total, 2 * 128


@pytest.mark.parametrize("padded", [True, False])
def test_layer_saved_bytes_equal_what_autograd_saves(padded):
    """The docstring's per-token table, checked against the learner's autograd graph at small, distinct widths."""
    import torch

    total, tokens = _saved_bytes_per_layer(torch.bfloat16, padded)
    dims = ModelDims(hidden=256, intermediate=1152, layers=3, heads=4, kv_heads=2, vocab=1000)
    targets = tuple(dims.module_widths())
    shape = LearnerShape(slots=2, rank=16, targets=targets, dtype_bytes=2, micro_batch_tokens=tokens, max_seq_len=128,
                         checkpointing=False, logit_chunk_tokens=0, padded=padded)
    casts = 2 * 2 * lora_params(dims, 16, targets) // dims.layers  # bf16 copies of both adapters' factors, per layer
    predicted = tokens * layer_saved_bytes(dims, shape) + casts
    # layer 0's input needs no gradient (embeddings are frozen), so its first norm saves less: compare a later layer
    assert total["layer1"] == predicted
    assert total["layer2"] == predicted


def test_7b_preset_fits_80gb_with_headroom_on_every_gpu(qwen7b_dir):
    plan = plan_of(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir))
    assert [r.device for r in plan.rows[:8]] == [f"GPU {g}" for g in range(8)]
    assert plan.fits, plan.verdict()
    assert all(r.headroom > 1 * GiB for r in plan.rows)
    assert plan.verdict().startswith("memory: fits (smallest headroom ")


def test_data_parallel_puts_every_members_state_on_every_learner_gpu(qwen7b_dir):
    """rl.data_parallel: each learner of a role holds all 4 of its members (not 1): 4x their adapter state (on 4+4)."""
    off, on = (plan_of(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir, "resources.inference_gpus=4", "resources.learner_gpus=4",
                              f"rl.data_parallel={flag}")) for flag in ("false", "true"))
    p = 161_480_704
    for plan, members in ((off, 1), (on, 4)):
        for gpu in range(4, 8):
            items = next(r for r in plan.rows if r.device == f"GPU {gpu}").items
            state = {k: v for k, v in items.items() if k.endswith("adapters (fp32 weights, AdamW moments)")}
            assert sorted(state.values()) == [12 * p * members] * 2, (gpu, state)


def test_single_agent_preset_fits(qwen7b_dir):
    plan = plan_of(preset("qwen2.5-7b-single.yaml", qwen7b_dir))
    assert plan.fits, plan.verdict()


def test_too_large_micro_batch_is_refused_naming_the_knob(qwen7b_dir):
    config = preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir)
    limit = plan_of(config).max_micro_batch_tokens
    assert limit is not None and limit >= config.rl.micro_batch_tokens
    assert plan_of(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir, f"rl.micro_batch_tokens={limit}")).fits
    refused = plan_of(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir, f"rl.micro_batch_tokens={limit + 1}"))
    assert not refused.fits
    verdict = refused.verdict()
    assert verdict.startswith("memory: does not fit: ") and "rl.micro_batch_tokens" in verdict
    assert "GPU 5-7 needs" in verdict and "GPU 0" not in verdict  # the learner GPUs of 5+3, no engine GPU


def test_40gb_gpus_are_refused_for_the_learners_and_warned_for_the_engines(qwen7b_dir):
    """The learners do not fit 40 GiB; the engines do (their KV cache is paged), with fewer sequences at once."""
    plan = plan_of(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir), gpu_gib=40)
    verdict = plan.verdict()
    assert verdict.startswith("memory: does not fit: ") and "rl.micro_batch_tokens" in verdict
    assert "GPU 0" not in verdict and "max_num_seqs" not in verdict
    assert len(plan.warnings) == 1 and plan.warnings[0].startswith(
        f"inference.vllm_engine_args.max_num_seqs=291 is more than the {plan.kv.chosen} the plan would choose")
    assert plan.kv.chosen < 291 and f"set inference.vllm_engine_args.max_num_seqs={plan.kv.chosen}" in plan.warnings[0]
    assert f"(propose) need 446,976 KV-cache tokens, more than the {plan.kv.pool_tokens:,} each replica holds" in (
        plan.warnings[0])  # 291 x 1,536: more than the whole cache, not only its headroom


# A decoder small enough to count by hand: q, k, v, o 64 x 64, gate/up/down 64 x 128 per layer, 2 layers, one KV head
# of 64, vocabulary 100, tied embeddings, no biases: N = 2 x (4 x 4,096 + 3 x 8,192 + 128) + 6,400 + 64 = 88,640.
SMALL = ModelDims(hidden=64, intermediate=128, layers=2, heads=1, kv_heads=1, vocab=100, tied_embeddings=True,
                  qkv_bias=False)
# bfloat16: KV 2 x 64 x 2 B x 2 layers = 512 B a token; fixed F = weights 2 N + LoRA slots 2 adapters x (2 layers x
# rank 8 x (64 + 64)) x 2 B + workspace 1,024 batched tokens x (4 x 64 + 3 x 128) x 2 B, no CUDA graphs (eager)
SMALL_FIXED = 2 * 88_640 + 2 * 2 * 8 * 128 * 2 + 1024 * 640 * 2
SMALL_GPU = 2 * (SMALL_FIXED + 40 * 262_944 + 100_000)  # budget 0.5 x this: F + 40 sequences' share + 100,000 B


def small_vllm(*overrides: str):
    """One vLLM replica (on a GPU, the learners on CPU) of the tiny preset's shape on SMALL: 2 adapters, longest expected
    sequence 64 + 192 = 256 tokens (solve; propose 100 + 28)."""
    return load_config(None, [
        "model.dtype=bfloat16", "lora.target_modules=[q_proj]", "population.teachers=1", "population.students=1",
        "inference.backend=vllm", "resources.inference_gpus=1", "resources.learner_gpus=0",
        "inference.vllm_engine_args.gpu_memory_utilization=0.5", "inference.vllm_engine_args.max_num_batched_tokens=1024",
        "inference.vllm_engine_args.enforce_eager=true", "plan.propose_prompt_tokens=100", "plan.proposal_tokens=28",
        "plan.solve_prompt_tokens=64", "plan.answer_tokens=192", *overrides])


def test_max_num_seqs_is_sized_from_the_expected_lengths_by_hand():
    """S = floor((B - F) / (E kv / (1 - h) + 8 V)): each sequence 256 x 512 / 0.5 = 262,144 B of KV cache with its
    headroom share and 800 B of sampler logits; the budget leaves 40 of them and 100,000 B."""
    config = small_vllm("inference.vllm_engine_args.max_num_seqs=40")
    assert SMALL.base_params() == 88_640
    kv = paged_kv(config, SMALL, SMALL_GPU)
    assert (kv.expected, kv.phase, kv.longest, kv.headroom) == (256, "solve", 1024, 0.5)
    assert kv.chosen == 40
    assert kv.pool_tokens == (40 * 262_944 + 100_000 - 40 * 800) // 512 == 20_675  # P = (B - F - 8 V m) / kv
    assert kv.running(100, 256) == 40 and kv.running(7, 256) == 7 and kv.running(100, 1024) == 20  # min(n, m, P // t)
    assert kv.waves(100, 256) == 3 and kv.waves(0, 256) == 0
    plan = plan_memory(config, SMALL, plan_placement(config), SMALL_GPU, HOST)
    engine = plan.rows[0]
    assert engine.items["KV cache in flight (paged): 40 seqs x 256 expected tokens x 0.5 KiB"] == 40 * 256 * 512
    assert engine.need == SMALL_FIXED + 40 * 800 + 40 * 256 * 512 and plan.fits and plan.warnings == []
    assert "the plan's 40" in plan.render() and "warning" not in plan.render()
    h = paged_kv(small_vllm("plan.kv_headroom=0.75"), SMALL, SMALL_GPU)
    assert h.chosen == (40 * 262_944 + 100_000) // (256 * 512 * 4 + 800) == 20  # a quarter of the cache for E tokens
    run = Lengths(propose_prompt=100, proposal=28, solve_prompt=64, answer=448, valid_fraction=0.5, source="a run")
    longer = paged_kv(config, SMALL, SMALL_GPU, run)  # a run's recorded lengths replace plan.*
    assert longer.expected == 512 and longer.chosen == (40 * 262_944 + 100_000) // (512 * 512 * 2 + 800) == 20
    assert "lengths from a run" in longer.summary()


def test_a_max_num_seqs_too_large_for_the_expected_lengths_is_a_warning_not_a_refusal():
    config = small_vllm("inference.vllm_engine_args.max_num_seqs=50")
    plan = plan_memory(config, SMALL, plan_placement(config), SMALL_GPU, HOST)
    assert plan.fits, plan.verdict()
    assert plan.kv.pool_tokens == (40 * 262_944 + 100_000 - 50 * 800) // 512
    assert plan.rows[0].items["KV cache in flight (paged): 50 seqs x 256 expected tokens x 0.5 KiB"] == 50 * 256 * 512
    (warning,) = plan.warnings
    assert warning.startswith("inference.vllm_engine_args.max_num_seqs=50 is more than the 40 the plan would choose")
    assert "preempts" in warning and warning.endswith("set inference.vllm_engine_args.max_num_seqs=40")
    assert f"warning: {warning}" in plan.render()
    default = small_vllm()  # vLLM's default 256, named as such
    assert plan_memory(default, SMALL, plan_placement(default), SMALL_GPU, HOST).warnings[0].startswith(
        "max_num_seqs 256 (vLLM's default) is more than the 40")


def test_an_engine_whose_cache_cannot_hold_one_longest_sequence_is_refused():
    """vLLM does not start unless its KV cache holds one sequence of max_model_len: the plan refuses that, naming it."""
    config = small_vllm("inference.vllm_engine_args.max_num_seqs=40", "model.max_seq_len=32768")  # P = 20,675 tokens
    plan = plan_memory(config, SMALL, plan_placement(config), SMALL_GPU, HOST)
    assert not plan.fits
    assert plan.rows[0].items["KV cache (paged): one sequence of 32768 tokens, the least vLLM starts with"] == 32768 * 512
    assert "lower model.max_seq_len (vLLM starts only if its KV cache holds one sequence of 32768 tokens; it holds " \
           "20,675)" in plan.verdict()


def test_auto_checkpointing_turns_on_only_when_needed(qwen7b_dir):
    big = preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir)
    assert big.rl.activation_checkpointing == "auto"
    plan = plan_of(big)
    assert plan.activation_checkpointing and with_resolved_checkpointing(big, plan).rl.activation_checkpointing == "on"
    assert not plan_of(big.model_copy(update={"rl": big.rl.model_copy(update={"activation_checkpointing": "off"})})).fits
    tiny = load_config()
    tiny_plan = plan_memory(tiny, load_model_dims(tiny), plan_placement(tiny), 80 * GiB, HOST)
    assert tiny_plan.fits and not tiny_plan.activation_checkpointing
    assert with_resolved_checkpointing(tiny, tiny_plan).rl.activation_checkpointing == "off"


def test_small_shm_is_refused(qwen7b_dir):
    config = preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir)
    plan = plan_memory(config, load_model_dims(config), plan_placement(config), 80 * GiB, HostView(64 * GiB, 64 * 2**20))
    assert not plan.fits and "--shm-size" in plan.verdict()


def test_missing_config_json_is_a_plan_input_error(tmp_path):
    with pytest.raises(PlanInputError, match="config.json"):
        load_model_dims(preset("qwen2.5-7b-4t4s.yaml", tmp_path))


def _launch(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_ADDRESS": "local"}  # never a cluster running on the machine
    return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_dry_run_prints_the_table_from_a_config_only_directory(qwen7b_dir):
    out = _launch("--dry-run", "--config", "configs/qwen2.5-7b-4t4s.yaml", f"model.path={qwen7b_dir}")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert [line for line in lines if line.startswith("memory: ")][0].startswith("memory: fits (smallest headroom ")
    assert lines[-1].startswith("time: ")  # the time plan closes the dry run (tests/test_time_plan.py)
    table = out.stdout.split("# memory plan")[1]
    for gpu in range(8):
        assert f"\nGPU {gpu} " in table
    assert "max_num_seqs: inference.vllm_engine_args.max_num_seqs=291; the plan's 291: " in out.stdout
    assert "warning:" not in out.stdout
    refused = _launch("--dry-run", "--config", "configs/qwen2.5-7b-4t4s.yaml", f"model.path={qwen7b_dir}",
                      "resources.gpu_memory_gib=40")
    assert refused.returncode == 1
    verdict = [line for line in refused.stdout.strip().splitlines() if line.startswith("memory: ")][0]
    assert verdict.startswith("memory: does not fit: ") and "rl.micro_batch_tokens" in verdict
    assert "\nwarning: inference.vllm_engine_args.max_num_seqs=291 is more than the " in refused.stdout


def test_gpu_check_without_cuda_records_every_part_and_writes_one_json(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-side behaviour; on a GPU machine run python -m gpu_check itself")
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, "-m", "gpu_check", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == json.loads(out.read_text())
    assert set(report["parts"]) == {"gpu_tests", "memory_plan", "learner", "evolution", "system", "vllm"}
    assert all(p["status"] in ("skipped", "not_run") and p["reason"] for p in report["parts"].values())
    assert report["ok"] is False and report["cuda"]["available"] is False


def test_gpu_check_says_why_a_part_failed():
    """The FAIL line names the cause: an exit code, failing tests, or the bench's numbers against its goal."""
    from gpu_check.check import failure_reason

    assert failure_reason({"status": "failed", "returncode": 3}) == "exit code 3"
    assert failure_reason({"status": "ok", "failed": ["tests.test_a::test_x"]}) == "failing tests: tests.test_a::test_x"
    missed = failure_reason({"status": "ok", "result": {"max_rel_error": 0.21, "under_measured": [], "within_goal": False}})
    assert missed.startswith("goal missed: ") and '"max_rel_error": 0.21' in missed


def test_gpu_check_sorts_ray_collection_errors_from_failures(tmp_path):
    from gpu_check.check import junit_summary

    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="1" skipped="1">'
        '<testcase classname="tests.test_a" name="test_x"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="tests.test_system" name=""><error message="ImportError: import of ray halted"/></testcase>'
        '<testcase classname="tests.test_b" name="test_y"><skipped/></testcase></testsuite></testsuites>'
    )
    summary = junit_summary(xml)
    assert summary["failed"] == ["tests.test_a::test_x"] and summary["needs_ray"] == ["tests.test_system::"]
    assert (summary["tests"], summary["failures"], summary["errors"], summary["skipped"]) == (3, 1, 1, 1)


def test_gpu_check_a_part_that_times_out_keeps_both_tails_and_leaves_no_process(tmp_path):
    """A part past its limit: the JSON keeps what it wrote to stdout and stderr (the system part's progress is on
    stderr), and the part's whole process group is ended, a grandchild it started included."""
    import time

    from gpu_check.check import failure_reason, run

    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; child = subprocess.Popen(['sleep', '300']); "
              f"open({str(pid_file)!r}, 'w').write(str(child.pid)); "
              "print('out-marker', flush=True); print('err-marker', file=sys.stderr, flush=True); time.sleep(300)")
    result = run([sys.executable, "-c", script], timeout=10)  # room for a Python start on a loaded machine
    assert result["status"] == "timeout" and result["seconds"] < 40
    assert "out-marker" in result["stdout_tail"] and "err-marker" in result["stderr_tail"]
    assert failure_reason(result) == "timed out after 10 s (--timeout)"  # the FAIL line says why
    grandchild = Path(f"/proc/{pid_file.read_text()}/stat")
    deadline = time.time() + 10
    while grandchild.exists() and grandchild.read_text().split(")")[-1].split()[0] != "Z" and time.time() < deadline:
        time.sleep(0.1)
    assert not grandchild.exists() or grandchild.read_text().split(")")[-1].split()[0] == "Z"


def _bench_memory_plan():
    """``bench.memory_plan``: its ``predict`` and ``judge`` are what the bench reports."""
    import bench.memory_plan

    return bench.memory_plan


@pytest.mark.parametrize("run", json.loads((ROOT / "tests" / "fixtures" / "memory_measured.json").read_text())["runs"],
                         ids=lambda run: f"{run['device']}-{run['hardware'].split()[1]}")
def test_plan_holds_against_the_measured_peaks(run):
    """Every committed measurement (an H100 and an H200 at 28 layers, this machine's CPU at 1 layer): the plan within 15% and
    never under a measured peak; the configurations that ran out of memory are the ones the plan says do not fit."""
    bench = _bench_memory_plan()
    results = []
    for conf in run["configurations"]:
        predicted = bench.predict(run["layers"], run["slots"], conf["tokens"], conf["checkpointing"], conf["chunk"], 2,
                                  run["device"])["total"]
        row = {**conf, "predicted": predicted}
        if "measured" in conf:
            row["rel_error"] = (predicted - conf["measured"]) / conf["measured"]
            row.setdefault("baseline", 0)
        results.append(row)
    verdict = bench.judge(results, run.get("capacity"))
    assert verdict["within_goal"], (verdict, [(r["name"], round(r.get("rel_error", 0), 4)) for r in results])


def test_gradients_of_earlier_micro_batches_count_in_the_run_plan(qwen7b_dir):
    """A step of several micro-batches keeps every gradient from the first backward on: the run's plan counts them
    at the logits' backward, a one-micro-batch step does not."""
    from planning.memory_plan import step_peak_bytes

    dims = load_model_dims(preset("qwen2.5-7b-4t4s.yaml", qwen7b_dir))
    kw = dict(slots=4, rank=64, targets=tuple(dims.module_widths()), dtype_bytes=2, micro_batch_tokens=4096,
              max_seq_len=1024, checkpointing=True, logit_chunk_tokens=0)
    grads = 4 * lora_params(dims, 64, kw["targets"]) * 4
    one = step_peak_bytes(dims, LearnerShape(**kw, accumulating=False))
    many = step_peak_bytes(dims, LearnerShape(**kw))
    assert many - one == pytest.approx(1.02 * grads, rel=1e-6)  # the logits' backward is the peak in both


def test_plan_holds_for_the_measured_7b_learner_step():
    """The H100's 8-adapter, 32,768-token learner step (44.18 GiB allocated at its peak; no constant was fitted to it):
    resident base and adapter state plus the plan's one-micro-batch step, within 15% and not under."""
    from planning.memory_plan import step_peak_bytes

    from bench import qwen25_7b

    m = json.loads((ROOT / "tests" / "fixtures" / "memory_measured.json").read_text())["learner_step"]
    dims = ModelDims.from_config_json(qwen25_7b.config_json(m["layers"]))
    targets = tuple(dims.module_widths())
    shape = LearnerShape(slots=m["slots"], rank=m["rank"], targets=targets, dtype_bytes=2, micro_batch_tokens=m["tokens"],
                         max_seq_len=m["tokens"] // m["rows"], checkpointing=m["checkpointing"],
                         logit_chunk_tokens=m["chunk"], loss_tokens=m["loss_tokens"], device=m["device"], accumulating=False)
    resident = dims.base_params() * 2 + 12 * lora_params(dims, m["rank"], targets) * m["slots"]
    predicted = resident + step_peak_bytes(dims, shape)
    measured = m["max_memory_allocated_gib"] * GiB
    assert measured <= predicted <= 1.15 * measured, predicted / GiB


def test_gpu_check_judges_each_part_by_its_goal():
    """Exit codes are not enough: a part passes when its numbers meet the goal. Fed the first H100 run's own
    results (the learner's ratio 1.097; evolution's slowest child 0.75 s) and cases just past each goal."""
    from gpu_check.check import judge

    ok = {"status": "ok"}
    assert judge("learner", {**ok, "result": {"mixed8_vs_single_ratio": 1.097}})["passed"]
    assert not judge("learner", {**ok, "result": {"mixed8_vs_single_ratio": 1.16}})["passed"]
    assert not judge("learner", {"status": "failed", "result": None})["passed"]
    assert judge("evolution", {**ok, "result": {"goal_s": 1.0, "within_goal": {"dare": True, "blend_svd": True}}})["passed"]
    assert not judge("evolution", {**ok, "result": {"goal_s": 1.0, "within_goal": {"dare": False, "blend_svd": True}}})["passed"]
    assert judge("memory_plan", {**ok, "result": {"within_goal": True}})["passed"]
    assert not judge("memory_plan", {**ok, "result": {"within_goal": False, "max_rel_error": 0.334}})["passed"]
    assert judge("gpu_tests", {**ok, "tests": 5, "skipped": 1, "failed": []})["passed"]
    assert not judge("gpu_tests", {"status": "failed", "tests": 5, "skipped": 0,
                                   "failed": ["tests.test_evolution_operators::test_cuda_children_match_cpu_children"]})["passed"]
    assert not judge("gpu_tests", {**ok, "tests": 3, "skipped": 3, "failed": []})["passed"]  # nothing ran


def test_gpu_check_names_what_the_machine_lacks(tmp_path):
    """Without pydantic or trueskill (the GPU machine has neither) the check stops at once, saying what to install."""
    blocked = ("import sys, runpy; sys.modules['pydantic'] = None; sys.modules['trueskill'] = None; "
               "sys.argv = ['gpu_check', '--out', sys.argv[1]]; runpy.run_module('gpu_check', run_name='__main__', alter_sys=True)")
    proc = subprocess.run([sys.executable, "-c", blocked, str(tmp_path / "g.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "lacks pydantic, trueskill" in proc.stderr and "pip install pydantic trueskill" in proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"ok": False, "missing": ["pydantic", "trueskill"]}


def test_memory_bench_reads_an_oom_from_the_flag_when_the_kept_tail_lost_the_words():
    """The H200 run's 16k plain-logits configuration failed with an error tail that began after "CUDA out of
    memory"; the bench flags the OOM from the whole stderr, and the judge counts it as planned (130.7 GB predicted
    over 150.1 GB of device less a 23.1 GB base)."""
    bench = _bench_memory_plan()
    row = {"name": "N=16384 ckpt=off logits=plain", "predicted": 130_710_772_776,
           "error": ".80 GiB of which 3.26 GiB is free.", "oom": True}
    measured = {"name": "N=4096 ckpt=on logits=256", "predicted": 4_059_960_606, "measured": 3_805_122_048,
                "baseline": 23_108_218_880, "rel_error": 0.067}
    assert bench.judge([measured, row], 150_110_945_280)["within_goal"]
    assert not bench.judge([measured, {**row, "oom": False}], 150_110_945_280)["within_goal"]


def test_a_verdict_folds_consecutive_gpus_of_one_message():
    from planning.memory_plan import span_devices

    assert span_devices(["GPU 0 generating", "GPU 1 generating", "GPU 2 generating", "GPU 4", "GPU 5", "GPU 7", "host"]) \
        == "GPU 0-2 generating, GPU 4-5, GPU 7, host"
    assert span_devices(["GPU 3 training", "GPU 4 generating"]) == "GPU 3 training, GPU 4 generating"
    assert span_devices([]) == ""
