"""Time one optimizer step of a batch that mixes 8 adapters, against the alternatives, in the same run.

Each model (a tiny Qwen2 and a Qwen2-shaped ~0.1B model, random init, float32, LoRA r=8 on all seven
projections) runs, interleaved round-robin so machine noise hits every variant alike:

- ``mixed8``:  ``PolicyLearner.step`` on 8 adapters x ``seqs`` sequences each (one forward/backward,
  8 per-adapter AdamW steps), grouped kernel, length-sorted padded rows (the defaults);
- ``single``:  the same tokens all on one adapter (same model, same slots);
- ``mixed8_bmm``: ``mixed8`` with the gather + bmm kernel;
- ``mixed8_pack``: ``mixed8`` with packed rows (per-token routing, block-diagonal attention mask);
- ``mixed8_chunk256``: ``mixed8`` with the LM head / log-softmax in chunks of 256 loss tokens, each
  recomputed in backward (``logit_chunk_tokens``; the other variants' 1024 loss tokens fit one chunk);
- ``mixed8_ckpt``: ``mixed8`` with every decoder layer checkpointed (recomputed in backward);
- ``peft_seq``: PEFT with the same 8 adapters, one ``set_adapter`` pass (forward, backward, AdamW step)
  per adapter, the only way PEFT can train them.

A second part measures padding waste on sequences of mixed lengths (uniform in [L/4, L]): computed
positions / real tokens, and step time, for ``pad`` vs ``pack``.

Times are CPU seconds of the process (``time.process_time``, one torch thread), which other jobs on a
shared machine disturb far less than wall time; wall medians are reported beside them. Progress goes to
stderr; the last stdout line is one JSON object with ``mixed8_vs_single_ratio`` (mixed8 / single median,
larger model), ``vs_peft_sequential`` (peft_seq / mixed8 median, larger model: how many times faster one
mixed pass is than PEFT's eight), per-model medians and the packing figures.
Run: ``nice -n 10 python -m bench.learner`` (3-8 minutes on two busy cores; ``--quick`` for a smoke run).

``--widths 7b`` times instead a Qwen2 with Qwen2.5-7B's widths (hidden 3584, intermediate 18944, 28 query /
4 KV heads, vocabulary 152,064; ``--layers`` decoder layers, default 2 on CPU, 28 for the whole model;
random bfloat16 weights; embeddings tied on CPU to halve the process's weights, untied as the real model on
CUDA, which changes no FLOP) with the 7B preset's LoRA (rank 64, alpha 128, all seven projections) and the
preset's step settings (activation checkpointing on, ``logit_chunk_tokens`` 1024): ``mixed8``, ``single``
(the same tokens on one adapter) and ``mixed8_bmm``, all on one model (the variants only change the routing
and the kernel; PEFT, packing and the checkpointing/chunking switches are left out, since at these widths a
second base or an unchunked step does not fit beside the first). Each adapter gets one sequence of
``--tokens-per-adapter`` tokens, half of them completion (loss) tokens. ``--device cuda`` runs on the GPU:
times are wall seconds between ``torch.cuda.synchronize`` calls and each variant's
``torch.cuda.max_memory_allocated`` during its steps is reported. CPU run (~6 GB, ~10 minutes on two busy
cores): ``nice -n 10 python -m bench.learner --widths 7b --layers 1 --repeats 2 --threads 2``; GPU:
``python -m bench.learner --device cuda --widths 7b --layers 28`` (what ``gpu_check/check.py`` runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable

import torch


from bench.qwen25_7b import WIDTHS as WIDTHS_7B

from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample, TokenBatch, micro_batches
from learners.multi_lora import TARGET_MODULES, LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig, group_normalised_advantages, policy_gradient_loss, token_logprobs
from learners.policy_learner import PolicyLearner, UpdateConfig

ADAPTERS = 8
RANK, ALPHA = 8, 16.0
PAD = 0
MODELS = {
    # name: Qwen2Config kwargs
    "tiny_8M": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=2048),
    "qwen2_0.1B": dict(hidden_size=768, intermediate_size=2304, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=32768, tie_word_embeddings=True),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_base(kwargs: dict, seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A randomly initialised Qwen2, built on ``device`` in ``dtype`` directly (no float32 transient)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**{"max_position_embeddings": 2048, "initializer_range": 0.02, **kwargs})
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)


def make_samples(vocab: int, adapters: list[int], seqs: int, prompt: int, completion: int, seed: int,
                 vary: bool = False) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for slot in adapters:
        for k in range(seqs):
            p, c = prompt, completion
            if vary:
                p = int(torch.randint(max(1, prompt // 4), prompt + 1, (1,), generator=g))
                c = int(torch.randint(max(1, completion // 4), completion + 1, (1,), generator=g))
            ids = torch.randint(1, vocab, (p + c,), generator=g).tolist()
            out.append(Sample(slot, ids[:p], ids[p:], reward=float(k % 2) * 2 - 1, group=("solve", "code_o")))
    return out


def relabel(samples: list[Sample], slot: int) -> list[Sample]:
    return [Sample(slot, s.prompt_ids, s.completion_ids, s.reward, s.group) for s in samples]


class OursVariant:
    """One multi-adapter model + PolicyLearner configured for a variant."""

    def __init__(self, base, strategy: str, batching: str, micro_tokens: int, checkpointing: bool = False,
                 logit_chunk_tokens: int = 1024, rank: int = RANK, alpha: float = ALPHA) -> None:
        self.model = MultiLoRAModel(base, LoRASpec(rank=rank, alpha=alpha, num_slots=ADAPTERS), strategy=strategy,
                                    init_b_std=0.01, seed=0)
        config = UpdateConfig(micro_batch_tokens=micro_tokens, batching=batching, activation_checkpointing=checkpointing,
                              logit_chunk_tokens=logit_chunk_tokens)
        self.learner = PolicyLearner(self.model, AdapterOptimizers(self.model, lr=1e-5), PGConfig(), config, PAD)

    def step(self, samples: list[Sample]) -> None:
        self.learner.step(samples)

    def step_with(self, strategy: str) -> Callable[[list[Sample]], None]:
        """A step with the router's kernel switched to ``strategy`` (the same model, weights and optimizers)."""
        def step(samples: list[Sample]) -> None:
            self.model.router.strategy = strategy
            self.learner.step(samples)
        return step


class PeftSequential:
    """PEFT with 8 named adapters; one set_adapter pass (forward, backward, AdamW step) per adapter."""

    def __init__(self, base, micro_tokens: int) -> None:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGET_MODULES), lora_dropout=0.0,
                            task_type="CAUSAL_LM")
        self.peft = get_peft_model(base, config, adapter_name="a0")
        for a in range(1, ADAPTERS):
            self.peft.add_adapter(f"a{a}", config)
        self.optims = {}
        for a in range(ADAPTERS):
            params = [p for n, p in self.peft.named_parameters() if f".a{a}." in n and "lora_" in n]
            self.optims[a] = torch.optim.AdamW(params, lr=1e-5)
        self.micro_tokens = micro_tokens

    def _loss_tokens(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        hf = self.peft.base_model.model
        hidden = hf.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               position_ids=batch.position_ids, use_cache=False).last_hidden_state
        logits = hf.get_output_embeddings()(hidden[batch.loss_mask])
        return token_logprobs(logits, batch.targets[batch.loss_mask]), batch.token_sample[batch.loss_mask]

    def step(self, samples: list[Sample]) -> None:
        self.peft.train()
        for a in sorted({s.slot for s in samples}):
            mine = [s for s in samples if s.slot == a]
            self.peft.set_adapter(f"a{a}")
            adv = group_normalised_advantages([s.reward for s in mine], [s.group for s in mine],
                                              [len(s.completion_ids) for s in mine])
            total = {0: float(sum(len(s.completion_ids) for s in mine))}
            device = next(iter(self.optims[a].param_groups[0]["params"])).device
            for batch in micro_batches(mine, PAD, self.micro_tokens, "pad"):
                logp, sample = self._loss_tokens(batch.to(device))
                out = policy_gradient_loss(logp, adv.to(device)[sample], torch.zeros_like(sample), PGConfig(),
                                           slot_token_totals=total)
                out.loss.backward()
            params = [p for g in self.optims[a].param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            self.optims[a].step()
            self.optims[a].zero_grad(set_to_none=True)


def time_round_robin(variants: dict, repeats: int, warmup: int = 1, device: str = "cpu"
                     ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, int]]:
    """CPU seconds (``process_time``, the ratios' basis on CPU: robust to other jobs on the machine), wall
    seconds (on CUDA between ``torch.cuda.synchronize`` calls: the basis there) and, on CUDA, each variant's
    ``torch.cuda.max_memory_allocated`` over its steps (bytes; empty on CPU)."""
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    peak: dict[str, int] = {}
    cuda = device == "cuda"
    names = list(variants)
    for r in range(warmup + repeats):
        # Rotate the order every round so no variant always runs right after the same neighbour.
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, samples = variants[name]
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            c0, w0 = time.process_time(), time.perf_counter()
            fn(samples)
            if cuda:
                torch.cuda.synchronize()
                peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated())
            if r >= warmup:
                cpu[name].append(time.process_time() - c0)
                wall[name].append(time.perf_counter() - w0)
        basis = wall if cuda else cpu
        log(f"  round {r + 1}/{warmup + repeats}: " + ", ".join(f"{n} {basis[n][-1]:.3f}s" if basis[n] else n for n in basis))
    return cpu, wall, peak


def bench_model(name: str, kwargs: dict, seqs: int, prompt: int, completion: int, repeats: int, device: str = "cpu") -> dict:
    log(f"[{name}] building on {device}")
    vocab = kwargs["vocab_size"]
    micro = ADAPTERS * seqs * (prompt + completion)  # whole batch in one micro-batch
    ours = OursVariant(build_base(kwargs, device=device), "grouped", "pad", micro)
    params = sum(p.numel() for n, p in ours.model.model.named_parameters() if "lora_" not in n)
    ours_bmm = OursVariant(build_base(kwargs, device=device), "bmm", "pad", micro)
    ours_pack = OursVariant(build_base(kwargs, device=device), "grouped", "pack", micro)
    ours_chunk = OursVariant(build_base(kwargs, device=device), "grouped", "pad", micro, logit_chunk_tokens=256)
    ours_ckpt = OursVariant(build_base(kwargs, device=device), "grouped", "pad", micro, checkpointing=True)
    peft = PeftSequential(build_base(kwargs, device=device), micro)
    mixed = make_samples(vocab, list(range(ADAPTERS)), seqs, prompt, completion, seed=1)
    single = relabel(mixed, 0)
    log(f"[{name}] {params / 1e6:.1f}M base params, {len(mixed)} sequences x {prompt + completion} tokens")
    cpu, wall, peak = time_round_robin({
        "mixed8": (ours.step, mixed),
        "single": (ours.step, single),
        "mixed8_bmm": (ours_bmm.step, mixed),
        "mixed8_pack": (ours_pack.step, mixed),
        "mixed8_chunk256": (ours_chunk.step, mixed),
        "mixed8_ckpt": (ours_ckpt.step, mixed),
        "peft_seq": (peft.step, mixed),
    }, repeats, device=device)
    med = {k: statistics.median(v) for k, v in (wall if device == "cuda" else cpu).items()}
    return {
        "base_params_M": round(params / 1e6, 1),
        "tokens_per_step": len(mixed) * (prompt + completion),
        "time_basis": "wall" if device == "cuda" else "cpu",
        "median_cpu_s": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
        "median_wall_s": {k: round(statistics.median(v), 4) for k, v in wall.items()},
        **({"max_memory_allocated_GiB": {k: round(v / 2**30, 2) for k, v in peak.items()}} if peak else {}),
        "mixed8_vs_single_ratio": round(med["mixed8"] / med["single"], 3),
        "vs_peft_sequential": round(med["peft_seq"] / med["mixed8"], 3),
        "bmm_vs_grouped_ratio": round(med["mixed8_bmm"] / med["mixed8"], 3),
        "pack_vs_pad_ratio": round(med["mixed8_pack"] / med["mixed8"], 3),
        "chunk256_vs_plain_ratio": round(med["mixed8_chunk256"] / med["mixed8"], 3),
        "ckpt_vs_plain_ratio": round(med["mixed8_ckpt"] / med["mixed8"], 3),
    }


def bench_packing(kwargs: dict, seqs: int, prompt: int, completion: int, micro: int, repeats: int, device: str = "cpu") -> dict:
    log("[packing] mixed-length sequences, pad vs pack")
    samples = make_samples(kwargs["vocab_size"], list(range(ADAPTERS)), seqs, prompt, completion, seed=2, vary=True)
    real = sum(len(s) for s in samples)
    computed = {mode: sum(b.padded_tokens for b in micro_batches(samples, PAD, micro, mode)) for mode in ("pad", "pack")}
    pad = OursVariant(build_base(kwargs, device=device), "grouped", "pad", micro)
    pack = OursVariant(build_base(kwargs, device=device), "grouped", "pack", micro)
    cpu, wall, _ = time_round_robin({"pad": (pad.step, samples), "pack": (pack.step, samples)}, repeats, device=device)
    med = {k: statistics.median(v) for k, v in (wall if device == "cuda" else cpu).items()}
    return {
        "real_tokens": real,
        "computed_over_real": {m: round(c / real, 3) for m, c in computed.items()},
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "time_basis": "wall" if device == "cuda" else "cpu",
        "pack_over_pad_time": round(med["pack"] / med["pad"], 3),
    }


RANK_7B, ALPHA_7B, CHUNK_7B = 64, 128.0, 1024  # configs/qwen2.5-7b-*.yaml: lora rank/alpha, rl.logit_chunk_tokens


def bench_7b(layers: int, tokens_per_adapter: int, repeats: int, device: str) -> dict:
    """mixed8 / single / mixed8_bmm at Qwen2.5-7B's widths with the 7B preset's LoRA and step settings, one model."""
    tied = device == "cpu"
    kwargs = {**WIDTHS_7B, "num_hidden_layers": layers, "tie_word_embeddings": tied, "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-6}
    log(f"[7b widths, {layers} layer(s)] building on {device} (bfloat16, embeddings {'tied' if tied else 'untied'})")
    base = build_base(kwargs, device=device, dtype=torch.bfloat16)
    params = sum(p.numel() for p in base.parameters())
    prompt = tokens_per_adapter // 2
    micro = ADAPTERS * tokens_per_adapter  # the whole batch in one micro-batch
    ours = OursVariant(base, "grouped", "pad", micro, checkpointing=True, logit_chunk_tokens=CHUNK_7B, rank=RANK_7B, alpha=ALPHA_7B)
    mixed = make_samples(WIDTHS_7B["vocab_size"], list(range(ADAPTERS)), 1, prompt, tokens_per_adapter - prompt, seed=1)
    single = relabel(mixed, 0)
    log(f"[7b widths] {params / 1e6:.1f}M base params, {len(mixed)} sequences x {tokens_per_adapter} tokens")
    cpu, wall, peak = time_round_robin({
        "mixed8": (ours.step_with("grouped"), mixed),
        "single": (ours.step_with("grouped"), single),
        "mixed8_bmm": (ours.step_with("bmm"), mixed),
    }, repeats, device=device)
    med = {k: statistics.median(v) for k, v in (wall if device == "cuda" else cpu).items()}
    return {
        "mixed8_vs_single_ratio": round(med["mixed8"] / med["single"], 3),
        "bmm_vs_grouped_ratio": round(med["mixed8_bmm"] / med["mixed8"], 3),
        "widths": "7b",
        "device": device,
        "layers": layers,
        "base_params_M": round(params / 1e6, 1),
        "dtype": "bfloat16",
        "tied_embeddings": tied,
        "lora": {"rank": RANK_7B, "alpha": ALPHA_7B, "slots": ADAPTERS},
        "activation_checkpointing": True,
        "logit_chunk_tokens": CHUNK_7B,
        "tokens_per_step": len(mixed) * tokens_per_adapter,
        "loss_tokens_per_step": sum(len(x.completion_ids) for x in mixed),
        "repeats": repeats,
        "time_basis": "wall" if device == "cuda" else "cpu",
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "median_cpu_s": {k: round(statistics.median(v), 4) for k, v in cpu.items()},
        "median_wall_s": {k: round(statistics.median(v), 4) for k, v in wall.items()},
        **({"max_memory_allocated_GiB": {k: round(v / 2**30, 2) for k, v in peak.items()}} if peak else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--widths", default="tiny", choices=["tiny", "7b"],
                        help="tiny: the tiny and ~0.1B models with every variant; 7b: Qwen2.5-7B's widths, the preset's settings")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers at --widths 7b (default 2 on CPU, 28 on CUDA)")
    parser.add_argument("--tokens-per-adapter", type=int, default=None,
                        help="--widths 7b: one sequence per adapter, half completion (default 512 on CPU, 4096 on CUDA)")
    parser.add_argument("--quick", action="store_true", help="tiny model only, few repeats (smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per variant (default 5; 3 at --widths 7b)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: OpenMP spin-waits collapse on a busy machine)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    torch.set_num_threads(args.threads)
    if args.widths == "7b":
        cuda = args.device == "cuda"
        layers = args.layers if args.layers is not None else (28 if cuda else 2)
        tokens = args.tokens_per_adapter or (4096 if cuda else 512)
        summary = bench_7b(layers, tokens, 2 if args.quick else (args.repeats or 3), args.device)
        summary["threads"] = args.threads
        print(json.dumps(summary))
        return
    repeats = 2 if args.quick else (args.repeats or 5)
    results = {"tiny_8M": bench_model("tiny_8M", MODELS["tiny_8M"], seqs=2, prompt=64, completion=64, repeats=repeats,
                                      device=args.device)}
    large = "tiny_8M" if args.quick else "qwen2_0.1B"
    if not args.quick:
        results[large] = bench_model(large, MODELS[large], seqs=1, prompt=64, completion=64, repeats=repeats, device=args.device)
    packing = bench_packing(MODELS["tiny_8M"], seqs=4, prompt=96, completion=160, micro=1024, repeats=repeats, device=args.device)
    summary = {
        "mixed8_vs_single_ratio": results[large]["mixed8_vs_single_ratio"],
        "vs_peft_sequential": results[large]["vs_peft_sequential"],
        "larger_model": large,
        "widths": "tiny",
        "device": args.device,
        "models": results,
        "packing": packing,
        "threads": args.threads,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
