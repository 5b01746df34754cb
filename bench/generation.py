"""Generation throughput of a batch that mixes 8 adapters against the same batch on 1 adapter, per backend.

For every available backend (transformers always; vLLM where it imports) one engine generates the same
64 requests (8 prompts x 8, temperature 1, seeded, ``--max-tokens`` new tokens) in three ways,
interleaved round-robin so machine noise hits each alike:

- ``mixed8``: request i uses adapter ``a{i % 8}``: eight adapters in one batch;
- ``single``: every request uses ``a0``;
- ``base``:   no adapter (the LoRA-free floor).

Throughput is generated tokens / wall seconds (median over ``--repeats``). The transformers backend is
measured with both multi-LoRA kernels of the learners' layer (``grouped``, the default, and ``bmm``).
Then the latency of a hot swap: ``load_adapter(name, dir, version)`` of an already-loaded adapter with new
weights (copy to a fresh versioned directory + in-place load), median of ``--swaps``.

Model: ``--model DIR`` (any local HF causal LM) or, by default, a random-init Qwen2 of the embedded tiny
model's shape (tinycoder ``ModelShape()``: hidden 256, 4 layers) with a locally trained tokenizer; 8 PEFT
adapters r=8 on all seven projections, written by the learners' ``save_adapter``.

Progress goes to stderr; the last stdout line is one JSON object with ``mixed_vs_single_throughput``
(transformers backend, default kernel: mixed8 / single tokens per second), ``hot_swap_ms`` (same backend)
and per-backend figures. Run (both backends: use the vLLM venv, see docs/inference.md):

    OMP_NUM_THREADS=1 nice -n 10 /opt/venv-vllm/bin/python -m bench.generation
    nice -n 10 python -m bench.generation --backends hf
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


import torch

from inference import GenerationRequest, make_engine, vllm_available
from planning.measurements import ADAPTER_RANK, build_adapters, build_model
from planning.model_files import model_dir_argument

ADAPTERS = 8
PROMPTS = [
    "def f(a):\n    return",
    "def f(xs):\n    total = 0\n    for x in xs:\n",
    "def f(s):\n    return ''.join(",
    "class Stack:\n    def __init__(self):\n",
    "def f(n):\n    if n < 2:\n        return n\n",
    "def f(d, k):\n    return sorted(d.items(),",
    "# Output of f('abc')\n",
    "def f(a, b):\n    out = []\n    for i in range(a):\n",
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prompts(tokenizer, prompt_tokens: int) -> list[str]:
    """``PROMPTS``, each after a shared block of ``prompt_tokens`` tokens of code (the loop's prompts are few-shot
    examples of 300-800 tokens; 0: the short prompts alone)."""
    if prompt_tokens <= 0:
        return PROMPTS
    ids = tokenizer(inspect.getsource(statistics), add_special_tokens=False)["input_ids"][:prompt_tokens]
    return [tokenizer.decode(ids) + "\n" + p for p in PROMPTS]


def workload(kind: str, max_tokens: int, texts: list[str]) -> list[GenerationRequest]:
    requests = []
    for i in range(ADAPTERS * len(texts)):
        adapter = {"mixed8": f"a{i % ADAPTERS}", "single": "a0", "base": None}[kind]
        requests.append(GenerationRequest(adapter, texts[i // ADAPTERS], temperature=1.0, max_tokens=max_tokens,
                                          seed=1000 + i))
    return requests


def measure(engine, adapters: list[Path], repeats: int, swaps: int, max_tokens: int, prompt_tokens: int = 0) -> dict:
    for slot, path in enumerate(adapters):
        engine.load_adapter(f"a{slot}", path, version=0)
    kinds = ("mixed8", "single", "base")
    texts = prompts(engine.tokenizer, prompt_tokens)
    batches = {k: workload(k, max_tokens, texts) for k in kinds}
    for kind in kinds:  # warm-up (vLLM's first batch is slow; caches, allocator)
        engine.generate(batches[kind][:8])
    seconds: dict[str, list[float]] = {k: [] for k in kinds}
    tokens: dict[str, int] = {}
    for rep in range(repeats):
        for kind in kinds:
            start = time.perf_counter()
            out = engine.generate(batches[kind])
            seconds[kind].append(time.perf_counter() - start)
            tokens[kind] = sum(len(g.token_ids) for gens in out for g in gens)
        log(f"  rep {rep + 1}/{repeats}: " + ", ".join(f"{k} {seconds[k][-1]:.2f}s" for k in kinds))
    tps = {k: tokens[k] / statistics.median(seconds[k]) for k in kinds}
    swap_ms = []
    for version in range(1, swaps + 1):
        source = adapters[version % len(adapters)]
        start = time.perf_counter()
        engine.load_adapter("a0", source, version=version)
        swap_ms.append(1000 * (time.perf_counter() - start))
    return {
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "tokens": tokens,
        "median_s": {k: round(statistics.median(v), 3) for k, v in seconds.items()},
        "mixed_vs_single_throughput": round(tps["mixed8"] / tps["single"], 3),
        "single_vs_base_throughput": round(tps["single"] / tps["base"], 3),
        "hot_swap_ms": round(statistics.median(swap_ms), 2),
        "hot_swap_ms_max": round(max(swap_ms), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=model_dir_argument, help="local HF causal LM directory (default: random tiny Qwen2)")
    parser.add_argument("--backends", default="hf,vllm", help="comma-separated subset of hf,vllm")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--swaps", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the transformers backend")
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="prefix each prompt with this many tokens of code (the loop's prompts: 300-800)")
    parser.add_argument("--vllm-args", type=json.loads, default={},
                        help='extra vllm.LLM arguments as JSON, e.g. \'{"enable_prefix_caching": false}\'')
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 repeat, 2 swaps, 8 tokens")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.swaps, args.max_tokens = 1, 2, 8
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    work = Path(tempfile.mkdtemp(prefix="bench-inference-"))
    model_dir = args.model or build_model(work / "model")
    adapters = build_adapters(model_dir, work / "adapters", ADAPTERS)
    log(f"model {model_dir}, {ADAPTERS} adapters r={ADAPTER_RANK}, 64 requests x {args.max_tokens} tokens")

    results: dict[str, dict] = {}
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "hf" in wanted:
        for strategy in ("grouped", "bmm"):
            log(f"backend hf, kernel {strategy}")
            engine = make_engine("hf", model_dir, max_adapters=ADAPTERS, max_lora_rank=ADAPTER_RANK, strategy=strategy)
            results[f"hf_{strategy}"] = measure(engine, adapters, args.repeats, args.swaps, args.max_tokens,
                                                   args.prompt_tokens)
            engine.close()
    if "vllm" in wanted:
        ok, why = vllm_available()
        if ok:
            log(f"backend vllm ({why})")
            engine = make_engine("vllm", model_dir, max_adapters=ADAPTERS, max_lora_rank=ADAPTER_RANK,
                                 engine_args={"max_num_seqs": 64, **args.vllm_args})
            results["vllm"] = measure(engine, adapters, args.repeats, args.swaps, args.max_tokens, args.prompt_tokens)
            engine.close()
        else:
            results["vllm"] = {"skipped": why}
    default = results.get("hf_grouped", {})
    summary = {
        "mixed_vs_single_throughput": default.get("mixed_vs_single_throughput"),
        "hot_swap_ms": default.get("hot_swap_ms"),
        "goal_mixed_vs_single": 0.85,
        "workload": {"requests": 64, "adapters": ADAPTERS, "max_tokens": args.max_tokens, "rank": ADAPTER_RANK,
                     "prompt_tokens": args.prompt_tokens, "vllm_args": args.vllm_args,
                     "model": str(args.model or "random tiny Qwen2 (tinycoder shape)"), "threads": args.threads},
        "backends": results,
    }
    if "vllm" in results and "tokens_per_s" in results["vllm"] and default:
        summary["vllm_vs_hf_mixed_throughput"] = round(
            results["vllm"]["tokens_per_s"]["mixed8"] / default["tokens_per_s"]["mixed8"], 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
