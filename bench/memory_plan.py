"""Check the memory plan's learner prediction against measured peaks at Qwen2.5-7B's widths.

A Qwen2 with Qwen2.5-7B's widths (hidden 3584, intermediate 18944, 28 query / 4 KV heads, vocabulary
152,064, untied head) and ``--layers`` decoder layers (random init, nothing downloaded), the 7B preset's LoRA
(rank 64, alpha 128, all seven projections) with ``--slots`` adapters, runs real ``learners.PolicyLearner``
steps: one micro-batch of N tokens (one row per adapter, one row 8 tokens shorter so a padding mask is
passed as in training), half of them completion (loss) tokens. Each configuration (activation checkpointing
on/off x chunked/plain logits x two micro-batch sizes) runs in a fresh subprocess:

1. build the base in the compute dtype, wrap it, build the optimizers, run one warm-up step (AdamW's moments
   now exist and stay; gradients are freed after each step);
2. baseline: resident memory (CPU, ``VmRSS``) or ``torch.cuda.memory_allocated`` (CUDA) before the second step;
3. peak: the high-water mark during the second step (CPU: ``VmHWM`` after resetting it through
   ``/proc/self/clear_refs``; CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``).

Measured = peak - baseline: the step's gradients plus its activations and logits. Predicted =
``planning.memory_plan.step_peak_bytes`` for a one-micro-batch step (``accumulating=False``) on that device kind.
On CPU glibc is told to serve every block over 64 KiB by ``mmap`` (``MALLOC_MMAP_THRESHOLD_``), so a freed
tensor leaves the resident set at once and RSS follows live tensors; what remains is allocator slack
(page rounding, the thread pools' scratch), which the comparison includes.

The last stdout line is one JSON object: per configuration the predicted and measured bytes and the relative
error, ``max_rel_error`` and ``within_goal`` (:func:`judge`: within 15%, never under a measured peak, and only
the configurations the plan says do not fit may run out of memory).
Run: ``nice -n 10 python -m bench.memory_plan`` (CPU: ~8 configurations of a few tens of seconds each, under
5 GB each); ``--device cuda --layers 28`` runs the full 7B-shaped learner on one GPU (bfloat16 base).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from bench import qwen25_7b
from planning.memory_plan import LearnerShape, ModelDims, lora_params, step_peak_bytes

RANK, ALPHA = 64, 128.0
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPT_FRACTION = 0.5
SHORTER_ROW = 8


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def row_lengths(tokens: int, slots: int) -> list[int]:
    """One row per adapter, ``tokens`` in all; the last row shorter so the batch needs a padding mask."""
    per = tokens // slots
    return [per] * (slots - 1) + [per - SHORTER_ROW]


def loss_tokens(tokens: int, slots: int) -> int:
    """Completion tokens of the micro-batch (the positions that reach the LM head)."""
    return sum(n - int(n * PROMPT_FRACTION) for n in row_lengths(tokens, slots))


def shape_of(slots: int, tokens: int, checkpointing: bool, chunk: int, dtype_bytes: int, device: str) -> LearnerShape:
    """The plan's learner shape of one configuration of this bench: one micro-batch, so gradients do not accumulate."""
    return LearnerShape(slots=slots, rank=RANK, targets=TARGETS, dtype_bytes=dtype_bytes, micro_batch_tokens=tokens,
                        max_seq_len=tokens // slots, checkpointing=checkpointing, logit_chunk_tokens=chunk,
                        loss_tokens=loss_tokens(tokens, slots), device=device, accumulating=False)


def predict(layers: int, slots: int, tokens: int, checkpointing: bool, chunk: int, dtype_bytes: int,
            device: str = "cpu") -> dict[str, int]:
    """The plan's prediction for one configuration of this bench."""
    dims = ModelDims.from_config_json(qwen25_7b.config_json(layers))
    shape = shape_of(slots, tokens, checkpointing, chunk, dtype_bytes, device)
    total = step_peak_bytes(dims, shape)
    grads = 4 * lora_params(dims, RANK, TARGETS) * slots
    return {"gradients": grads, "activations": total - grads, "total": total}


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def build(spec: dict) -> tuple:
    """The 7B-shaped learner of ``spec`` and its one micro-batch of samples: (learner, samples, device)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learners.adapter_optim import AdapterOptimizers
    from learners.batching import Sample
    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.pg_loss import PGConfig
    from learners.policy_learner import PolicyLearner, UpdateConfig

    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    torch.manual_seed(0)
    config = Qwen2Config(**qwen25_7b.config_json(spec["layers"], torch_dtype=spec["dtype"]))
    torch.set_default_dtype(dtype)  # build the weights in the compute dtype directly (no float32 transient)
    with device:
        base = Qwen2ForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    model = MultiLoRAModel(base, LoRASpec(rank=RANK, alpha=ALPHA, num_slots=spec["slots"], target_modules=TARGETS),
                           init_b_std=0.01, seed=0)
    optimizers = AdapterOptimizers(model, lr=1e-5)
    learner = PolicyLearner(model, optimizers, PGConfig(),
                            UpdateConfig(micro_batch_tokens=spec["tokens"], activation_checkpointing=spec["checkpointing"],
                                         logit_chunk_tokens=spec["chunk"]), pad_token_id=0)
    g = torch.Generator().manual_seed(1)
    samples = []
    for slot, n in enumerate(row_lengths(spec["tokens"], spec["slots"])):
        ids = torch.randint(1, qwen25_7b.CONFIG["vocab_size"], (n,), generator=g).tolist()
        p = int(n * PROMPT_FRACTION)
        samples.append(Sample(slot, ids[:p], ids[p:], reward=float(slot % 2) * 2 - 1, group=("solve", "code_o")))
    return learner, samples, device


def run_one(spec: dict) -> dict:
    """In this (fresh) process: build, warm up, measure one step's peak over its baseline."""
    import torch

    learner, samples, device = build(spec)
    learner.step(samples)  # warm-up: AdamW's moments are created here and stay
    if device.type == "cuda":
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        learner.step(samples)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        baseline = _status_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        learner.step(samples)
        peak = _status_kib("VmHWM") * 1024
    return {"measured": peak - baseline, "baseline": baseline, "peak": peak}


def configurations(tokens: list[int], chunk: int) -> list[dict]:
    return [{"tokens": n, "checkpointing": ckpt, "chunk": c}
            for n in tokens for ckpt in (False, True) for c in (chunk, 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--tokens", default=None, help="comma-separated micro-batch sizes (default: 1024,2048 on CPU; "
                        "4096,16384 on CUDA)")
    parser.add_argument("--chunk", type=int, default=256, help="rl.logit_chunk_tokens of the chunked configurations")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration (JSON) in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return
    tokens = [int(t) for t in (args.tokens or ("1024,2048" if args.device == "cpu" else "4096,16384")).split(",")]
    dtype_bytes = 2 if args.dtype == "bfloat16" else 4
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    results = []
    for conf in configurations(tokens, args.chunk):
        spec = {**conf, "device": args.device, "dtype": args.dtype, "layers": args.layers, "slots": args.slots,
                "threads": args.threads}
        name = f"N={conf['tokens']} ckpt={'on' if conf['checkpointing'] else 'off'} logits={conf['chunk'] or 'plain'}"
        predicted = predict(args.layers, args.slots, conf["tokens"], conf["checkpointing"], conf["chunk"], dtype_bytes,
                            args.device)
        log(f"[{name}] running")
        proc = subprocess.run([sys.executable, "-m", "bench.memory_plan", "--one", json.dumps(spec)], capture_output=True, text=True,
                              env=env, cwd=ROOT)
        if proc.returncode != 0:
            log(proc.stderr[-2000:])
            # the OOM flag is read from the whole stderr: the kept tail can cut "CUDA out of memory" off
            results.append({"name": name, **conf, "predicted": predicted["total"], "error": proc.stderr[-500:],
                            "oom": "out of memory" in proc.stderr.lower()})
            continue
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        rel = (predicted["total"] - measured["measured"]) / measured["measured"]
        results.append({"name": name, **conf, "predicted": predicted["total"], "predicted_parts": predicted,
                        "measured": measured["measured"], "baseline": measured["baseline"], "rel_error": round(rel, 4)})
        log(f"[{name}] predicted {predicted['total'] / 2**20:8.1f} MiB, measured {measured['measured'] / 2**20:8.1f} MiB "
            f"({rel:+.1%})")
    print(json.dumps({
        "device": args.device, "layers": args.layers, "slots": args.slots, "rank": RANK, "dtype": args.dtype,
        "chunk": args.chunk, "configurations": results, **judge(results, device_capacity(args.device)),
    }))


GOAL = 0.15


def device_capacity(device: str) -> int | None:
    """Bytes of the CUDA device (None on CPU: there a configuration that fails is never expected to)."""
    if device != "cuda":
        return None
    import torch

    return torch.cuda.get_device_properties(0).total_memory


def judge(results: list[dict], capacity: int | None) -> dict:
    """The bench's goal: every measured peak within ``GOAL`` of the plan and none above it (a plan that says
    "fits" must fit), and every configuration that failed ran out of memory where the plan said it would not fit
    (predicted step bytes above the device's capacity minus the resident baseline of the measured ones)."""
    measured = [r for r in results if "rel_error" in r]
    baseline = min((r["baseline"] for r in measured), default=0)
    under = [r["name"] for r in measured if r["predicted"] < r["measured"]]
    expected_oom = [r["name"] for r in results if "error" in r
                    and (r.get("oom") or "out of memory" in r["error"].lower())
                    and capacity is not None and r["predicted"] > capacity - baseline]
    unexpected = [r["name"] for r in results if "error" in r and r["name"] not in expected_oom]
    max_rel = max((abs(r["rel_error"]) for r in measured), default=None)
    return {
        "max_rel_error": max_rel, "under_measured": under, "failed": [r["name"] for r in results if "error" in r],
        "expected_oom": expected_oom, "unexpected_failures": unexpected, "goal": GOAL,
        "within_goal": bool(measured) and max_rel <= GOAL and not under and not unexpected,
    }

if __name__ == "__main__":
    main()
