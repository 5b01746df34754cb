"""One benchmark for 8 adapters: one mixed-adapter engine pass versus 8 one-adapter passes, in one run.

The same engine (every adapter loaded once) and the same sandbox judge evaluate the same benchmark
(``--problems`` HumanEval-layout tasks written by this script, greedy, ``--max-tokens`` new tokens)
two ways, alternating ``--repeats`` times so machine noise hits both alike:

- ``mixed``: ``evaluation.harness.evaluate`` with all 8 adapters: one ``generate`` call whose batches mix adapters;
- ``sequential``: 8 calls of ``evaluate``, one adapter each (how one-model-at-a-time harnesses run).

Times are wall seconds of generation plus judging (median over repeats). Model: ``--model DIR`` or the
built-in tiny model (``tinycoder`` ``test`` variant, built and cached on first use); 8 PEFT adapters
r=8 (B ~ N(0, 0.02)) written by the learners' ``save_adapter`` (``planning.measurements.build_adapters``).

Progress goes to stderr; the last stdout line is one JSON object with ``mixed_vs_sequential``
(mixed seconds / sequential seconds: below 1 means the mixed pass is faster) and ``speedup`` (its inverse).

    nice -n 10 python -m bench.eval_harness
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


import torch

from inference import make_engine
from evaluation.code_judge import CodeJudge, JudgeLimits
from evaluation.datasets import load_benchmark
from evaluation.harness import Decoding, ModelSpec, evaluate
from planning.measurements import build_adapters
from planning.model_files import model_dir_argument

ADAPTERS = 8


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_benchmark(path: Path, problems: int) -> Path:
    """``problems`` HumanEval-layout tasks (check(candidate) with the expected values written in)."""
    rows = []
    for k in range(problems):
        prompt = f'def add_{k}(x):\n    """Return x plus {k}."""\n'
        test = f"def check(candidate):\n    assert candidate(1) == {1 + k}\n    assert candidate(-{k}) == 0\n"
        rows.append({"task_id": f"Synthetic/{k}", "prompt": prompt, "entry_point": f"add_{k}",
                     "canonical_solution": f"    return x + {k}\n", "test": test})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=model_dir_argument, help="local HF causal LM directory (default: the tiny test model)")
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backend", choices=("auto", "hf", "vllm"), default="auto")
    ap.add_argument("--workers", type=int, default=None, help="parallel sandbox runs")
    ap.add_argument("--threads", type=int, default=None, help="torch threads")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from tinycoder import ensure_model

        args.model = ensure_model("test", progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        adapters = build_adapters(args.model, tmp_path / "adapters", ADAPTERS)
        problems = load_benchmark("humaneval", [write_benchmark(tmp_path / "HumanEval.jsonl", args.problems)])
        engine = make_engine(args.backend, args.model, max_adapters=ADAPTERS, max_lora_rank=8, max_model_len=2048)
        for i, path in enumerate(adapters):
            engine.load_adapter(f"a{i}", path, version=1)
        models = [ModelSpec(f"a{i}", f"a{i}", "population") for i in range(ADAPTERS)]
        decoding = Decoding(samples=1, max_tokens=args.max_tokens)
        times: dict[str, list[float]] = {"mixed": [], "sequential": []}
        generate: dict[str, list[float]] = {"mixed": [], "sequential": []}
        scores: dict[str, dict[str, float]] = {}
        with CodeJudge(JudgeLimits(floor_s=2.0, workers=args.workers)) as judge:
            evaluate(engine, problems[:2], models[:2], "r1", engine.tokenizer, decoding, judge, None)  # warm-up
            for r in range(args.repeats):
                start = time.perf_counter()
                mixed, timing = evaluate(engine, problems, models, "r1", engine.tokenizer, decoding, judge, None)
                times["mixed"].append(time.perf_counter() - start)
                generate["mixed"].append(timing["generate_s"])
                start = time.perf_counter()
                sequential, spent = {}, 0.0
                for m in models:
                    score, timing = evaluate(engine, problems, [m], "r1", engine.tokenizer, decoding, judge, None)
                    sequential.update(score)
                    spent += timing["generate_s"]
                generate["sequential"].append(spent)
                times["sequential"].append(time.perf_counter() - start)
                log(f"repeat {r}: mixed {times['mixed'][-1]:.2f} s, sequential {times['sequential'][-1]:.2f} s")
                scores = {"mixed": {k: v["pass@1"] for k, v in mixed.items()}, "sequential": {k: v["pass@1"] for k, v in sequential.items()}}
        engine.close()
    mixed_s, sequential_s = statistics.median(times["mixed"]), statistics.median(times["sequential"])
    print(json.dumps({
        "mixed_vs_sequential": round(mixed_s / sequential_s, 4), "speedup": round(sequential_s / mixed_s, 3),
        "mixed_s": round(mixed_s, 3), "sequential_s": round(sequential_s, 3),
        "generate_mixed_s": round(statistics.median(generate["mixed"]), 3),
        "generate_sequential_s": round(statistics.median(generate["sequential"]), 3), "adapters": ADAPTERS,
        "problems": args.problems, "max_tokens": args.max_tokens, "engine": type(engine).__name__,
        "same_scores": scores["mixed"] == scores["sequential"], "pass@1": scores["mixed"],
        "model": str(args.model), "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
