"""``python -m evaluation RUN_DIR --benchmarks humaneval+,mbpp+,math500 --data DIR [...]``

Evaluates every member of a checkpoint, the frozen base and (``--compare``) another run's members
through ONE engine: every adapter is loaded at once and each benchmark is one mixed-adapter
``generate`` pass. ``--oracle`` scores the reference solutions instead (no model). Writes
``RUN_DIR/eval/<checkpoint>/results.{json,md,png}`` and prints the table. Never writes into the
model or the data directory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from evaluation.code_judge import CodeJudge, JudgeLimits
from evaluation.datasets import BENCHMARKS, MATH_BENCHMARKS, BenchmarkFileError, find_file, load_benchmark
from evaluation.harness import Decoding, ModelSpec, evaluate, ks_for, oracle
from evaluation.math_grade import MathGrader
from evaluation.report import markdown_table, write_outputs
from evaluation.runs import RunDirError, checkpoint_dir, members, model_path, run_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__.split("\n\n")[1])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--checkpoint", type=int, default=None, help="step N of checkpoints/step-N (default: the latest)")
    ap.add_argument("--benchmarks", required=True,
                    help=f"comma-separated names ({', '.join(BENCHMARKS)}); NAME=PATH points at a file")
    ap.add_argument("--data", type=Path, default=None, help="directory holding the benchmark files")
    ap.add_argument("--compare", type=Path, default=None, help="another run (e.g. the single agent) on the same base")
    ap.add_argument("--compare-checkpoint", type=int, default=None)
    ap.add_argument("--samples", type=int, default=1, help="samples per problem: pass@k for k <= n (default 1, greedy)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature when --samples > 1")
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per answer (default: inference.max_tokens)")
    ap.add_argument("--prompt-style", choices=("auto", "r1", "chat"), default="auto",
                    help="auto: chat when the run's tasks.prompt_style is chat, else r1")
    ap.add_argument("--backend", choices=("auto", "hf", "vllm"), default=None, help="default: the run's inference.backend")
    ap.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark")
    ap.add_argument("--oracle", action="store_true", help="score the reference solutions (no model)")
    ap.add_argument("--no-base", action="store_true", help="leave the frozen base out")
    ap.add_argument("--timeout-floor", type=float, default=4.0, help="per-run limit floor in s (evalplus: 4; AZR: 10)")
    ap.add_argument("--timeout-factor", type=float, default=4.0, help="x reference time (evalplus: 4; AZR: 8)")
    ap.add_argument("--livecodebench-timeout", type=float, default=6.0)
    ap.add_argument("--workers", type=int, default=None, help="parallel sandbox runs (default: the CPUs here)")
    args = ap.parse_args(argv)
    if args.samples < 1:
        ap.error("--samples must be at least 1")
    return args


def load_all(spec: str, data: Path | None, limit: int | None) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        name, _, path = item.partition("=")
        if name not in BENCHMARKS:
            raise BenchmarkFileError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
        if path:
            paths = [Path(path)]
        elif data is None:
            raise BenchmarkFileError(f"{name}: give --data DIR or {name}=PATH")
        else:
            paths = find_file(data, name)
        problems = load_benchmark(name, paths)
        out[name] = problems[:limit] if limit else problems
    return out


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        benchmarks = load_all(args.benchmarks, args.data, args.limit)
        checkpoint = None if args.oracle else checkpoint_dir(args.run_dir, args.checkpoint)
    except (BenchmarkFileError, RunDirError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out_dir = args.run_dir / "eval" / ("oracle" if checkpoint is None else checkpoint.name)
    if args.data is not None and _inside(out_dir, args.data):
        print(f"error: the output {out_dir} would be inside the data directory {args.data}", file=sys.stderr)
        return 2
    limits = JudgeLimits(args.timeout_floor, args.timeout_factor, args.livecodebench_timeout, workers=args.workers)
    needs_math = any(b in MATH_BENCHMARKS for b in benchmarks)
    judge = CodeJudge(limits)
    grader = MathGrader() if needs_math else None
    results: dict[str, Any] = {
        "run_dir": str(args.run_dir), "checkpoint": "oracle" if checkpoint is None else checkpoint.name,
        "compare_run_dir": str(args.compare) if args.compare else None, "samples": args.samples,
        "k": ks_for(args.samples), "math_grader": grader.grader if grader else None,
        "limits": {"floor_s": limits.floor_s, "factor": limits.factor, "livecodebench_timeout_s": limits.livecodebench_timeout_s},
        "benchmarks": {}, "models": {}, "timings": {},
    }
    engine = None
    try:
        if args.oracle:
            results["models"]["oracle (reference solutions)"] = {"group": "oracle", "benchmarks": {}}
            for name, problems in benchmarks.items():
                score = oracle(problems, judge, grader)
                results["benchmarks"][name] = {"problems": len(problems)}
                results["models"]["oracle (reference solutions)"]["benchmarks"][name] = score
        else:
            engine, models, style, tokenizer, max_tokens = _build_engine(args, checkpoint)
            results.update(prompt_style=style, engine=type(engine).__name__, max_tokens=max_tokens)
            for m in models:
                results["models"][m.label] = {"group": m.group, "adapter": m.adapter, "benchmarks": {}}
            decoding = Decoding(args.samples, args.temperature, max_tokens)
            for name, problems in benchmarks.items():
                scores, timing = evaluate(engine, problems, models, style, tokenizer, decoding, judge, grader)
                results["benchmarks"][name] = {"problems": len(problems)}
                results["timings"][name] = timing
                for label, score in scores.items():
                    results["models"][label]["benchmarks"][name] = score
                print(f"{name}: {len(problems)} problems x {len(models)} models in one engine pass "
                      f"({timing['generate_s']:.1f} s generating, {timing['judge_s']:.1f} s judging)", file=sys.stderr)
    except (RunDirError, BenchmarkFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        judge.close()
        if grader is not None:
            grader.close()
        if engine is not None:
            engine.close()
    paths = write_outputs(results, out_dir)
    print(markdown_table(results))
    print(f"wrote {paths['json']}, {paths['table']}, {paths['chart']}")
    return 0


def _build_engine(args: argparse.Namespace, checkpoint: Path):
    """One engine holding every adapter: this run's members, the compared run's members; the base."""
    from actors.engines.factory import make_engine

    config = run_config(args.run_dir)
    base = model_path(config)
    population = [("population", "", m) for m in members(checkpoint)]
    step = int(checkpoint.name.split("-")[1])
    compared = []
    if args.compare is not None:
        other = run_config(args.compare)
        if model_path(other) != base:
            raise RunDirError(f"{args.compare} was trained on {model_path(other)}, not on this run's base {base}: "
                              "one engine serves one base model")
        compared = [("compare", "compare:", m) for m in members(checkpoint_dir(args.compare, args.compare_checkpoint))]
    everyone = population + compared
    engine = make_engine(
        args.backend or config.inference.backend, base, max_adapters=len(everyone),
        max_lora_rank=max(m.rank for _, _, m in everyone), dtype=config.model.dtype, max_model_len=config.model.max_seq_len,
        seed=config.run.seed, target_modules=list(config.lora.target_modules),
    )
    models: list[ModelSpec] = []
    for group, prefix, m in everyone:
        engine.load_adapter(f"{prefix}{m.name}", m.path, version=step)  # copied into the engine's store, never moved
        models.append(ModelSpec(f"{prefix}{m.name}", f"{prefix}{m.name}", group))
    if not args.no_base:
        models.append(ModelSpec("base", None, "base"))
    style = args.prompt_style
    if style == "auto":
        style = "chat" if config.tasks.prompt_style == "chat" else "r1"
    max_tokens = args.max_tokens or config.inference.max_tokens
    return engine, models, style, engine.tokenizer, max_tokens


if __name__ == "__main__":
    sys.exit(main())
