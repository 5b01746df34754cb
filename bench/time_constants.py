"""Measure the CPU constants of the time plan (``planning/time_constants.py``, kind ``cpu`` and ``HOST``).

On this machine, with the built-in tiny model's shape (random weights: nothing is downloaded and rows run to
``max_tokens``) and the tiny default's LoRA (rank 8, all seven projections), each actor's way of running
(one torch thread, as ``POPULORA_LEARNER_THREADS`` / ``POPULORA_INFERENCE_THREADS`` default):

- training: one ``PolicyLearner`` step of 2 adapters (a learner of the 2+2 default) on ``--train-seqs``
  sequences of the tiny default's lengths (spread around ``--train-prompt`` + ``--train-completion``);
  effective FLOP/s = tokens x F / seconds with F of ``planning.time_plan`` (the CPU kind's peak);
- generation on the transformers engine (4 adapters loaded): rows = 1 and rows = ``--rows`` decoding
  ``--new`` tokens after short prompts give the fixed cost of a decode step (as a memory bandwidth: weight
  bytes / step) and the cost of each added row-token (as ``decode_mfu``); ``--rows`` rows of
  ``--prompt`` tokens with one new token give ``prefill_mfu``;
- (the adapter hand-over's constants come from ``bench/adapter_transport.py``, which runs the real publish path); checkpoint write bandwidth (AdamW state + adapters to a temporary directory, fsynced); the
  league's match + record of a 2+2 step; one evolution child of the tiny default's size (median operator).

None of this runs the loop: ``bench/time_plan.py`` plans the tiny default from these numbers and then runs it.
The last stdout line is one JSON object with every constant under ``constants`` (paste into
``planning/time_constants.py``).

    nice -n 10 python bench/time_constants.py            # ~2 minutes on two cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))

import torch  # noqa: E402

from configs import PRESETS_DIR, load_config  # noqa: E402
from planning.memory_plan import ModelDims, load_model_dims, lora_params  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(fn, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_training(model_dir: Path, config, dims: ModelDims, seqs: int, prompt: int, completion: int,
                     repeats: int) -> dict:
    from transformers import AutoModelForCausalLM

    from learners.adapter_optim import AdapterOptimizers
    from learners.batching import Sample
    from learners.multi_lora import LoRASpec, MultiLoRAModel
    from learners.pg_loss import PGConfig
    from learners.policy_learner import PolicyLearner, UpdateConfig
    from planning.time_plan import _flops_per_trained_token

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    mlm = MultiLoRAModel(base, LoRASpec(rank=config.lora.rank, alpha=config.lora.alpha, num_slots=2), init_b_std=0.01, seed=0)
    learner = PolicyLearner(mlm, AdapterOptimizers(mlm, lr=1e-4), PGConfig(),
                            UpdateConfig(micro_batch_tokens=config.rl.micro_batch_tokens, activation_checkpointing=False,
                                         logit_chunk_tokens=config.rl.logit_chunk_tokens), pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    lengths = [(prompt + (i * 7) % 31 - 15, completion + (i * 5) % 21 - 10) for i in range(seqs)]  # spread like a step's
    samples = [Sample(i % 2, torch.randint(1, dims.vocab, (p,), generator=g).tolist(),
                      torch.randint(1, dims.vocab, (c,), generator=g).tolist(), float(i % 3) - 1, ("solve", "code_o"))
               for i, (p, c) in enumerate(lengths)]
    seconds = timed(lambda: learner.step(samples), repeats)
    tokens = sum(p + c for p, c in lengths)
    flops = tokens * _flops_per_trained_token(config, dims, checkpointing=False)
    return {"train_seconds": seconds, "train_tokens": tokens, "train_flops_per_s": flops / seconds}


def measure_generation(model_dir: Path, adapters: list[Path], dims: ModelDims, rows: int, new: int, prompt: int,
                       repeats: int) -> dict:
    from inference import GenerationRequest
    from inference.hf_engine import HFEngine

    engine = HFEngine(model_dir, max_adapters=len(adapters) + 1, max_lora_rank=8, max_model_len=2048, device="cpu")
    for i, path in enumerate(adapters):
        engine.load_adapter(f"a{i}", path, version=0)
    short = "def f(a):\n    return"
    long_prompt = engine.tokenizer.decode(torch.randint(1, dims.vocab, (prompt,), generator=torch.Generator().manual_seed(1)).tolist())

    def batch(count: int, text: str, max_tokens: int) -> list:
        return [GenerationRequest(f"a{i % len(adapters)}", text, temperature=1.0, max_tokens=max_tokens, seed=i)
                for i in range(count)]

    one = timed(lambda: engine.generate(batch(1, short, new)), repeats)
    many = timed(lambda: engine.generate(batch(rows, short, new)), repeats)
    prefill = timed(lambda: engine.generate(batch(rows, long_prompt, 1)), repeats)
    prompt_tokens = rows * len(engine.tokenizer(long_prompt)["input_ids"])
    n = dims.base_params()
    step = one / new
    per_row_token = (many - one) / ((rows - 1) * new)
    engine.close()
    return {"decode_step_s": step, "decode_row_token_s": per_row_token, "prefill_s": prefill,
            "prefill_tokens": prompt_tokens, "weight_bytes": n * 4,
            "decode_flops_per_s": 2 * n / per_row_token, "prefill_flops_per_s": 2 * n * prompt_tokens / prefill}


def measure_host(dims: ModelDims, config, repeats: int) -> dict:
    from evolution import operators

    rank = config.lora.rank
    widths = dims.module_widths()
    adapter = {}
    for layer in range(dims.layers):
        for module, (d_in, d_out) in widths.items():
            key = f"base_model.model.model.layers.{layer}.{'self_attn' if module[0] in 'qkvo' else 'mlp'}.{module}"
            adapter[f"{key}.lora_A.weight"] = torch.randn(rank, d_in) * 0.02
            adapter[f"{key}.lora_B.weight"] = torch.randn(d_out, rank) * 0.02
    other = {k: v + 0.01 * torch.randn_like(v) for k, v in adapter.items()}
    g = torch.Generator().manual_seed(0)
    child_s = statistics.median(
        [timed(lambda op=op: operators.MUTATIONS[op](adapter, strength=0.1, generator=g), repeats) for op in operators.MUTATIONS]
        + [timed(lambda op=op: operators.CROSSOVERS[op](adapter, other, generator=g), repeats) for op in operators.CROSSOVERS])
    members = config.population.adapters
    p = lora_params(dims, rank, config.lora.target_modules)
    state = {f"m{i}": torch.randn(3 * p) for i in range(members)}  # fp32 weights + AdamW's two moments

    def write() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for name, tensor in state.items():
                path = Path(tmp) / f"{name}.pt"
                with open(path, "wb") as f:
                    torch.save(tensor, f)
                    f.flush()
                    os.fsync(f.fileno())

    ckpt_s = timed(write, repeats)
    return {"evolution_child_s": child_s, "checkpoint_bytes": members * 12 * p, "checkpoint_s": ckpt_s,
            "league_s": measure_league(config, repeats)}


def measure_league(config, repeats: int) -> float:
    """Match and record one step of the config's population on the pure league (no Ray round trip)."""
    from evolution.league import League

    lg = config.league
    league = League(mu=lg.mu, sigma=lg.sigma, beta=lg.beta, tau=lg.tau, seed=0)
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
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_inference", ROOT / "bench" / "inference.py")
    bench_inference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_inference)  # the generation bench's model and adapters (a file named like the package)
    build_model, build_adapters = bench_inference.build_model, bench_inference.build_adapters

    config = load_config(PRESETS_DIR / "tiny.yaml")
    dims = load_model_dims(config)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model")
        adapters = build_adapters(model_dir, Path(tmp) / "adapters", config.population.adapters)
        log("[time_constants] training")
        train = measure_training(model_dir, config, dims, args.train_seqs, args.train_prompt, args.train_completion,
                                 args.repeats)
        log("[time_constants] generation and hand-over")
        gen = measure_generation(model_dir, adapters, dims, args.rows, args.new, args.prompt, args.repeats)
    log("[time_constants] host")
    host = measure_host(dims, config, args.repeats)
    peak = train["train_flops_per_s"]
    constants = {
        "cpu.peak_flops": peak,
        "cpu.train_mfu": 1.0,
        "cpu.memory_bandwidth": gen["weight_bytes"] / gen["decode_step_s"],
        "cpu.decode_mfu": gen["decode_flops_per_s"] / peak,
        "cpu.prefill_mfu": gen["prefill_flops_per_s"] / peak,
        "cpu.lora_decode_overhead": 0.0,
        "host.checkpoint_bandwidth": host["checkpoint_bytes"] / host["checkpoint_s"],
        "host.league_s": host["league_s"],
        "host.evolution_s_floor": host["evolution_child_s"],
    }
    print(json.dumps({"model": "tiny default shape (random weights)", "threads": 1, "train": train,
                      "generation": {k: v for k, v in gen.items()}, "host": host,
                      "constants": {k: float(f"{v:.4g}") for k, v in constants.items()}}))


if __name__ == "__main__":
    main()
