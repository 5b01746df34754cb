"""Measure the CPU constants of the time plan (``planning/time_constants.py``, kind ``cpu`` and ``HOST``).

On this machine, with the built-in tiny model's shape (random weights: nothing is downloaded and rows run to
``max_tokens``) and the tiny default's LoRA (rank 8, all seven projections), each actor's way of running
(one torch thread, as ``POPULORA_LEARNER_THREADS`` / ``POPULORA_INFERENCE_THREADS`` default):

- training: one ``PolicyLearner`` step of 2 adapters (a learner of the 2+2 default) on ``--train-seqs``
  sequences of the tiny default's lengths (spread around ``--train-prompt`` + ``--train-completion``);
  effective FLOP/s = tokens x F / seconds with F of ``planning.time_plan`` (the CPU kind's peak);
- generation on the transformers engine (4 adapters loaded): rows = 1 and rows = ``--rows`` decoding
  ``--new`` tokens after short prompts give the fixed cost of a decode step (as a memory bandwidth: weight
  bytes / step) and the cost of each added row-token (as ``decode_mfu``: the rows on one adapter; spread over all
  four, ``lora_decode_overhead``); ``--rows`` rows of ``--prompt`` tokens with one new token give ``prefill_mfu``;
- (the adapter hand-over's constants come from ``bench/adapter_transport.py``, which runs the real publish path); checkpoint write bandwidth (AdamW state + adapters to a temporary directory, fsynced); the
  league's match + record of a 2+2 step; one evolution child of the tiny default's size (median operator).

The measuring functions here are the ones ``planning/calibrate.py`` runs on a user's node, at the config's model and
engine (one implementation of each measurement). None of this runs the loop: ``bench/time_plan.py`` plans the tiny default from these numbers and then runs it.
The last stdout line is one JSON object with every constant under ``constants`` (paste into
``planning/time_constants.py``).

    nice -n 10 python -m planning.measurements            # ~2 minutes on two cores
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

from configs import PRESETS_DIR, load_config
from planning.memory_plan import ModelDims, load_model_dims, lora_params

ADAPTER_RANK, ADAPTER_ALPHA = 8, 16.0  # the adapters of build_adapters: the tiny default's LoRA


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(fn, repeats: int, sync=None) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` (after one warm-up); ``sync``: called before each clock read
    (``torch.cuda.synchronize`` on a GPU)."""
    fn()
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cuda_sync(device: str):
    return torch.cuda.synchronize if str(device).startswith("cuda") else None


def measure_training(model_dir: Path, config, dims: ModelDims, seqs: int, prompt: int, completion: int,
                     repeats: int, device: str = "cpu", slots: int = 2, checkpointing: bool = False) -> dict:
    """One ``PolicyLearner`` step of ``slots`` adapters (the config's LoRA) over ``seqs`` sequences of about ``prompt``
    + ``completion`` tokens, the base in ``model.dtype`` on ``device``: training FLOP/s with F of the time plan."""
    from transformers import AutoModelForCausalLM

    from learners.adapter_optim import AdapterOptimizers
    from learners.batching import Sample
    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.pg_loss import PGConfig
    from learners.policy_learner import PolicyLearner, UpdateConfig
    from planning.time_plan import _flops_per_trained_token

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, config.model.dtype)).to(device)
    spec = LoRASpec(rank=config.lora.rank, alpha=config.lora.alpha, num_slots=slots,
                    target_modules=tuple(config.lora.target_modules), rslora=config.lora.rslora)
    mlm = MultiLoRAModel(base, spec, init_b_std=0.01, seed=0, device=device)
    learner = PolicyLearner(mlm, AdapterOptimizers(mlm, lr=1e-4), PGConfig(),
                            UpdateConfig(micro_batch_tokens=config.rl.micro_batch_tokens,
                                         activation_checkpointing=checkpointing,
                                         logit_chunk_tokens=config.rl.logit_chunk_tokens), pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    lengths = [(max(1, prompt + (i * 7) % 31 - 15), max(1, completion + (i * 5) % 21 - 10))
               for i in range(seqs)]  # spread like a step's
    samples = [Sample(i % slots, torch.randint(1, dims.vocab, (p,), generator=g).tolist(),
                      torch.randint(1, dims.vocab, (c,), generator=g).tolist(), float(i % 3) - 1, ("solve", "code_o"))
               for i, (p, c) in enumerate(lengths)]
    seconds = timed(lambda: learner.step(samples), repeats, cuda_sync(device))
    tokens = sum(p + c for p, c in lengths)
    flops = tokens * _flops_per_trained_token(config, dims, checkpointing=checkpointing)
    del learner, mlm, base
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
    return {"train_seconds": seconds, "train_tokens": tokens, "train_flops_per_s": flops / seconds,
            "train_tokens_per_s": tokens / seconds, "checkpointing": checkpointing, "slots": slots}


def measure_generation(engine, adapters: list[str], dims: ModelDims, rows: int, new: int, prompt: int,
                       repeats: int, dtype_bytes: int) -> dict:
    """Decode and prefill of a built ``engine`` with ``adapters`` loaded (their names), the tokens counted from what
    it returns (rows may stop early on a real model):

    - one row, then ``rows`` rows spread over every adapter, then ``rows`` rows on the first adapter alone, each
      decoding up to ``new`` tokens after a short prompt: one row's step is the fixed cost of a decode step (a
      memory bandwidth: weight bytes / step), the rows beyond it give the cost of each added row-token
      (``decode_flops_per_s``: on one adapter; ``..._all_adapters``: spread over all, the LoRA decode overhead);
    - ``rows`` rows of about ``prompt`` new random tokens each (never the same twice, so no prefix cache helps) and
      one new token: prefill FLOP/s."""
    from inference import GenerationRequest

    short = "def f(a):\n    return"
    fresh = iter(range(10**9))

    def run(requests) -> tuple[int, int, int]:
        """(new tokens, the longest row's, prompt tokens) of one generate call."""
        out = [g[0] for g in engine.generate(requests)]
        return (sum(len(g.token_ids) for g in out), max(len(g.token_ids) for g in out),
                sum(len(g.prompt_token_ids) for g in out))

    def decode(count: int, names: list[str]) -> tuple[float, tuple[int, int, int]]:
        requests = [GenerationRequest(names[i % len(names)], short, temperature=1.0, max_tokens=new, seed=i)
                    for i in range(count)]
        counts = run(requests)
        return timed(lambda: run(requests), repeats), counts

    def long_prompts() -> list:
        g = torch.Generator().manual_seed(next(fresh))
        return [GenerationRequest(adapters[i % len(adapters)],
                                  engine.tokenizer.decode(torch.randint(1, min(dims.vocab, len(engine.tokenizer)) - 1,
                                                                        (prompt,), generator=g).tolist()),
                                  temperature=1.0, max_tokens=1, seed=i) for i in range(rows)]

    one_s, (one_tokens, _, _) = decode(1, adapters[:1])
    step = one_s / one_tokens  # one row: each step costs its fixed part and one row-token

    def per_row_token(seconds: float, counts: tuple[int, int, int]) -> float:
        """Seconds of each row-token beyond one row's steps; where noise hides them (too few rows or tokens), the
        mean seconds per token, an upper bound."""
        total, longest, _ = counts
        beyond = seconds - longest * step
        return beyond / (total - longest) if beyond > 0 and total > longest else seconds / max(total, 1)

    many_s, many = decode(rows, adapters)
    single_s, single = decode(rows, adapters[:1])
    prefill_tokens = []
    prefill_s = timed(lambda: prefill_tokens.append(run(long_prompts())[2]), repeats)
    n = dims.base_params()
    all_rt, one_rt = per_row_token(many_s, many), per_row_token(single_s, single)
    return {"rows": rows, "new": new, "decode_step_s": step, "decode_row_token_s_all_adapters": all_rt,
            "decode_row_token_s_one_adapter": one_rt, "decode_tokens": [one_tokens, many[0], single[0]],
            "prefill_s": prefill_s, "prefill_tokens": prefill_tokens[-1], "weight_bytes": n * dtype_bytes,
            "decode_flops_per_s": 2 * n / one_rt, "decode_flops_per_s_all_adapters": 2 * n / all_rt,
            "decode_tokens_per_s_all_adapters": 1 / all_rt,
            "prefill_flops_per_s": 2 * n * prefill_tokens[-1] / prefill_s,
            "prefill_tokens_per_s": prefill_tokens[-1] / prefill_s}


def adapter_tensors(dims: ModelDims, rank: int, targets, layers: int | None = None, dtype=torch.float32,
                    seed: int = 0) -> dict[str, torch.Tensor]:
    """A random adapter of ``dims``' widths (PEFT keys), ``layers`` decoder layers (default all)."""
    from learners.peft_io import peft_key

    g = torch.Generator().manual_seed(seed)
    widths = dims.module_widths()
    out = {}
    for layer in range(dims.layers if layers is None else layers):
        for module in targets:
            d_in, d_out = widths[module]
            path = f"model.layers.{layer}.{'self_attn' if module[0] in 'qkvo' else 'mlp'}.{module}"
            out[peft_key(path, "A")] = (torch.randn(rank, d_in, generator=g) * 0.02).to(dtype)
            out[peft_key(path, "B")] = (torch.randn(d_out, rank, generator=g) * 0.02).to(dtype)
    return out


def adapter_files(config, dims: ModelDims, dtype, seed: int = 0) -> dict[str, bytes]:
    """A random adapter of the config's LoRA as the files of a PEFT directory, in ``dtype``."""
    from peft import LoraConfig

    from learners.peft_io import peft_files

    lora = config.lora
    peft_config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, use_rslora=lora.rslora,
                             target_modules=sorted(lora.target_modules), lora_dropout=0.0, bias="none",
                             task_type="CAUSAL_LM")
    return peft_files(adapter_tensors(dims, lora.rank, lora.target_modules, dtype=dtype, seed=seed), peft_config)


def build_model(out_dir: Path) -> Path:
    """A random-init Qwen2 of the embedded tiny model's shape, with a BPE tokenizer trained on stdlib source."""
    import collections
    import json as json_module
    import random

    from tinycoder.model import new_model
    from tinycoder.settings import ModelShape
    from tinycoder.tokenizer import save_tokenizer, train_tokenizer

    texts = [inspect.getsource(m) for m in (collections, json_module, random, argparse, statistics, tempfile)]
    tokenizer = train_tokenizer(texts, vocab_size=1024)
    torch.manual_seed(0)
    model = new_model(ModelShape(), tokenizer)
    model.save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)
    return out_dir


def build_adapters(model_dir: Path, out_dir: Path, count: int, init_b_std: float = 0.02) -> list[Path]:
    """``count`` PEFT adapters (B ~ N(0, ``init_b_std``)) saved by the learners' own publisher."""
    from transformers import AutoModelForCausalLM

    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.peft_io import save_adapter

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    mlm = MultiLoRAModel(base, LoRASpec(rank=ADAPTER_RANK, alpha=ADAPTER_ALPHA, num_slots=count), init_b_std=init_b_std, seed=0)
    return [save_adapter(mlm, slot, out_dir / f"a{slot}") for slot in range(count)]


def write_files(files: dict[str, bytes], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    return out


def measure_handover(engine, config, dims: ModelDims, scratch: Path, repeats: int) -> dict:
    """A proxy of the hand-over (``bench/adapter_transport.py`` runs the real one through Ray): one adapter of the
    config's LoRA exported in the serving dtype (PEFT files in memory), written to ``scratch`` (RAM-backed) and
    loaded in place into ``engine`` as a new version; bytes / seconds, the fixed cost of a swap included."""
    dtype = getattr(torch, config.model.dtype)
    version = iter(range(1, 10**9))
    sizes = []

    def once() -> None:
        v = next(version)
        files = adapter_files(config, dims, dtype, seed=v)
        sizes.append(sum(len(d) for d in files.values()))
        engine.load_adapter("a0", write_files(files, scratch / f"a0-v{v}"), v, move=True)

    seconds = timed(once, repeats)
    return {"handover_s": seconds, "adapter_bytes": sizes[-1], "handover_bytes_per_s": sizes[-1] / seconds}


def measure_host(dims: ModelDims, config, repeats: int, evolution_layers: int | None = None,
                 checkpoint_max_bytes: float = float("inf"), scratch: Path | None = None) -> dict:
    """One evolution child (median operator) of the config's LoRA over ``evolution_layers`` layers (default all), a
    checkpoint of every member (AdamW state + weights, at most ``checkpoint_max_bytes``, fsynced into ``scratch``),
    the league's match + record."""
    from evolution import operators

    adapter = adapter_tensors(dims, config.lora.rank, config.lora.target_modules, evolution_layers)
    other = {k: v + 0.01 * torch.randn_like(v) for k, v in adapter.items()}
    g = torch.Generator().manual_seed(0)
    child_s = statistics.median(
        [timed(lambda op=op: operators.MUTATIONS[op](adapter, strength=0.1, generator=g), repeats) for op in operators.MUTATIONS]
        + [timed(lambda op=op: operators.CROSSOVERS[op](adapter, other, generator=g), repeats) for op in operators.CROSSOVERS])
    members = config.population.adapters
    p = lora_params(dims, config.lora.rank, config.lora.target_modules)
    per_member = int(min(3 * p, checkpoint_max_bytes / 4 / members))
    state = {f"m{i}": torch.randn(per_member) for i in range(members)}  # fp32 weights + AdamW's two moments

    def write() -> None:
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            for name, tensor in state.items():
                path = Path(tmp) / f"{name}.pt"
                with open(path, "wb") as f:
                    torch.save(tensor, f)
                    f.flush()
                    os.fsync(f.fileno())

    ckpt_s = timed(write, repeats)
    return {"evolution_child_s": child_s, "evolution_layers": evolution_layers or dims.layers,
            "checkpoint_bytes": members * 4 * per_member, "checkpoint_s": ckpt_s,
            "league_s": measure_league(config, repeats)}


def measure_league(config, repeats: int) -> float:
    """Match and record one step of the config's population on the pure league (no Ray round trip)."""
    from evolution.league import League

    lg = config.league
    league = League(mu=lg.mu, sigma=lg.sigma, beta=lg.beta, tau=lg.tau, matching=lg.matching, seed=0)
    teachers = [f"t{i}" for i in range(config.population.teachers)]
    students = [f"s{i}" for i in range(config.population.students)]
    for t in teachers:
        league.add_member(t, "teacher")
    for s in students:
        league.add_member(s, "student")

    def one() -> None:
        for teacher, student in league.match(teachers, students).items():
            league.record(teacher, student, [(True, 0.5)] * config.tasks.tasks_per_teacher)

    return timed(one, repeats)


def device_constants(kind: str, train: dict, gen: dict, cited_peak: float | None) -> dict[str, float]:
    """The plan's ``<kind>.*`` constants from the training and generation measurements. With a cited peak (a
    datasheet) each MFU is a measured rate over it; without one (the CPU kind, a kind nobody cites) the peak is
    the measured training rate (an effective peak, ``train_mfu`` 1)."""
    peak = cited_peak or train["train_flops_per_s"]
    out = {} if cited_peak else {f"{kind}.peak_flops": peak}
    return {**out,
            f"{kind}.train_mfu": train["train_flops_per_s"] / peak,
            f"{kind}.memory_bandwidth": gen["weight_bytes"] / gen["decode_step_s"],
            f"{kind}.decode_mfu": gen["decode_flops_per_s"] / peak,
            f"{kind}.prefill_mfu": gen["prefill_flops_per_s"] / peak,
            f"{kind}.lora_decode_overhead": min(0.9, max(0.0, 1 - gen["decode_flops_per_s_all_adapters"]
                                                         / gen["decode_flops_per_s"]))}


def host_constants(host: dict) -> dict[str, float]:
    """The plan's ``host.*`` constants of :func:`measure_host`."""
    return {"host.checkpoint_bandwidth": host["checkpoint_bytes"] / host["checkpoint_s"],
            "host.league_s": host["league_s"], "host.evolution_s_floor": host["evolution_child_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--train-seqs", type=int, default=40, help="sequences of one learner step (a tiny-default "
                        "student learner trains ~40 a step)")
    parser.add_argument("--train-prompt", type=int, default=90, help="their mean prompt tokens (tiny default: ~85)")
    parser.add_argument("--train-completion", type=int, default=35, help="their mean completion tokens (~35)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = load_config(PRESETS_DIR / "tiny.yaml")
    dims = load_model_dims(config)
    from inference.hf_engine import HFEngine

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model")
        adapters = build_adapters(model_dir, Path(tmp) / "adapters", config.population.adapters)
        log("[time_constants] training")
        train = measure_training(model_dir, config, dims, args.train_seqs, args.train_prompt, args.train_completion,
                                 args.repeats)
        log("[time_constants] generation")
        engine = HFEngine(model_dir, max_adapters=len(adapters) + 1, max_lora_rank=8, max_model_len=2048, device="cpu")
        for i, path in enumerate(adapters):
            engine.load_adapter(f"a{i}", path, version=0)
        gen = measure_generation(engine, [f"a{i}" for i in range(len(adapters))], dims, args.rows, args.new,
                                 args.prompt, args.repeats, dtype_bytes=4)
        engine.close()
    log("[time_constants] host")
    host = measure_host(dims, config, args.repeats)
    constants = {**device_constants("cpu", train, gen, None), **host_constants(host)}
    print(json.dumps({"model": "tiny default shape (random weights)", "threads": 1, "train": train,
                      "generation": gen, "host": host,
                      "constants": {k: float(f"{v:.4g}") for k, v in constants.items()}}))


if __name__ == "__main__":
    main()
