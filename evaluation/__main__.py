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
from evaluation.resume import FinishedBenchmarks, fingerprint
from evaluation.runs import RunDirError, checkpoint_dir, members, model_path, run_config

ORACLE = "oracle (reference solutions)"
JUDGED_AS = "HumanEval+/MBPP+: evalplus main @ 26d6d00 (evaluation.evalplus_rules)"


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
    ap.add_argument("--timeout-floor", type=float, default=4.0, help="per-input limit floor in s (evalplus: 4; AZR: 10)")
    ap.add_argument("--timeout-factor", type=float, default=4.0, help="x the reference's time on that input (evalplus: 4; AZR: 8)")
    ap.add_argument("--livecodebench-timeout", type=float, default=6.0)
    ap.add_argument("--workers", type=int, default=None, help="parallel sandbox runs (default: the CPUs here)")
    ap.add_argument("--fresh", action="store_true", help="evaluate every benchmark again (ignore finished ones saved earlier)")
    args = ap.parse_args(argv)
    if args.samples < 1:
        ap.error("--samples must be at least 1")
    return args


def load_all(spec: str, data: Path | None, limit: int | None) -> tuple[dict[str, tuple[list[Any], list[Path]]], dict[str, str]]:
    """Every named benchmark's problems and files, and the error of each that cannot be read (a bad
    file stops only its own benchmark; the message names the file, the line and the task)."""
    out: dict[str, tuple[list[Any], list[Path]]] = {}
    errors: dict[str, str] = {}
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        name, _, path = item.partition("=")
        try:
            if name not in BENCHMARKS:
                raise BenchmarkFileError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
            if path:
                paths = [Path(path)]
            elif data is None:
                raise BenchmarkFileError(f"{name}: give --data DIR or {name}=PATH")
            else:
                paths = find_file(data, name)
            problems = load_benchmark(name, paths)
        except BenchmarkFileError as exc:
            errors[name] = str(exc)
            continue
        out[name] = (problems[:limit] if limit else problems, paths)
    return out, errors


def _inside(path: Path, parent: Path) -> bool:
    try:
        path.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    benchmarks, errors = load_all(args.benchmarks, args.data, args.limit)
    for name, message in errors.items():
        print(f"error: {name}: {message}", file=sys.stderr)
    if not benchmarks:
        return 2
    try:
        checkpoint = None if args.oracle else checkpoint_dir(args.run_dir, args.checkpoint)
        models = [ModelSpec(ORACLE, None, "oracle")] if checkpoint is None else _model_specs(args, checkpoint)[1]
    except RunDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out_dir = args.run_dir / "eval" / ("oracle" if checkpoint is None else checkpoint.name)
    if args.data is not None and _inside(out_dir, args.data):
        print(f"error: the output {out_dir} would be inside the data directory {args.data}", file=sys.stderr)
        return 2
    limits = JudgeLimits(args.timeout_floor, args.timeout_factor, args.livecodebench_timeout, workers=args.workers)
    problems_total = sum(len(p) for p, _ in benchmarks.values())
    print(f"plan: {len(models)} models ({', '.join(m.label for m in models)}) x {len(benchmarks)} benchmarks "
          f"({problems_total} problems) x {args.samples} samples = {len(models) * problems_total * args.samples} "
          f"{'reference runs' if args.oracle else 'generations'} (one engine pass per benchmark); output {out_dir}",
          file=sys.stderr)
    # the compared run's checkpoint is named in results.md and is part of what a finished benchmark was scored on
    compare_checkpoint = checkpoint_dir(args.compare, args.compare_checkpoint).name if args.compare and checkpoint else None
    settings = {"checkpoint": None if checkpoint is None else str(checkpoint), "compare": str(args.compare),
                "compare_checkpoint": compare_checkpoint, "models": [m.label for m in models],
                "samples": args.samples, "temperature": args.temperature, "max_tokens": args.max_tokens, "prompt_style": args.prompt_style,
                "backend": args.backend, "limit": args.limit, "limits": [limits.floor_s, limits.factor, limits.livecodebench_timeout_s]}
    finished = FinishedBenchmarks(out_dir)
    needs_math = any(b in MATH_BENCHMARKS for b in benchmarks)
    judge = CodeJudge(limits)
    grader = MathGrader() if needs_math else None
    results: dict[str, Any] = {
        "run_dir": str(args.run_dir), "checkpoint": "oracle" if checkpoint is None else checkpoint.name,
        "compare_run_dir": str(args.compare) if args.compare else None,
        "compare_checkpoint": compare_checkpoint,
        "samples": args.samples,
        "k": ks_for(args.samples), "math_grader": grader.grader if grader else None,
        "limits": {"floor_s": limits.floor_s, "factor": limits.factor, "livecodebench_timeout_s": limits.livecodebench_timeout_s},
        "judged_as": JUDGED_AS, "benchmarks": {}, "models": {m.label: {"group": m.group, "adapter": m.adapter, "benchmarks": {}} for m in models},
        "timings": {}, "errors": dict(errors), "complete": False,
    }
    built = None
    try:
        for done, (name, (problems, paths)) in enumerate(benchmarks.items(), 1):
            print_ = fingerprint(name, paths, settings)
            record = None if args.fresh else finished.load(name, print_)
            if record is not None:
                print(f"[{done}/{len(benchmarks)}] {name}: finished earlier, taken from {finished.root / (name + '.json')}", file=sys.stderr)
            elif args.oracle:
                start = time.perf_counter()
                record = {"problems": len(problems), "scores": {ORACLE: oracle(problems, judge, grader)},
                          "timing": {"judge_s": time.perf_counter() - start}}
            else:
                if built is None:
                    built = _build_engine(args, checkpoint)
                    results.update(prompt_style=built[2], engine=type(built[0]).__name__, max_tokens=built[4])
                engine, models, style, tokenizer, max_tokens = built
                decoding = Decoding(args.samples, args.temperature, max_tokens)
                print(f"[{done}/{len(benchmarks)}] {name}: generating {len(problems) * len(models) * args.samples} answers...",
                      file=sys.stderr, flush=True)
                scores, timing = evaluate(engine, problems, models, style, tokenizer, decoding, judge, grader)
                record = {"problems": len(problems), "scores": scores, "timing": timing}
            if "fingerprint" not in record:
                finished.save(name, print_, record)
                timing = record["timing"]
                print(f"[{done}/{len(benchmarks)}] {name}: {len(problems)} problems x {len(models)} models done "
                      f"({timing.get('generate_s', 0.0):.1f} s generating, {timing['judge_s']:.1f} s judging)", file=sys.stderr)
            results["benchmarks"][name] = {"problems": record["problems"]}
            results["timings"][name] = record["timing"]
            for label, score in record["scores"].items():
                results["models"][label]["benchmarks"][name] = score
    except (RunDirError, BenchmarkFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        judge.close()
        if grader is not None:
            grader.close()
        if built is not None:
            built[0].close()
    results["complete"] = not errors
    paths = write_outputs(results, out_dir)
    print(markdown_table(results))
    print(f"wrote {paths['json']}, {paths['table']}, {paths['chart']}")
    if errors:
        print(f"INCOMPLETE: {len(errors)} benchmark(s) not evaluated ({', '.join(errors)}); results.json says complete: false",
              file=sys.stderr)
        return 1
    return 0


def _model_specs(args: argparse.Namespace, checkpoint: Path) -> tuple[list[tuple[str, str, Any]], list[ModelSpec]]:
    """(group, label prefix, member) of every adapter, and the models evaluated (the base last)."""
    population = [("population", "", m) for m in members(checkpoint)]
    compared = []
    if args.compare is not None:
        compared = [("compare", "compare:", m) for m in members(checkpoint_dir(args.compare, args.compare_checkpoint))]
    everyone = population + compared
    models = [ModelSpec(f"{prefix}{m.name}", f"{prefix}{m.name}", group) for group, prefix, m in everyone]
    if not args.no_base:
        models.append(ModelSpec("base", None, "base"))
    return everyone, models


def _build_engine(args: argparse.Namespace, checkpoint: Path):
    """One engine holding every adapter: this run's members, the compared run's members; the base."""
    from inference.factory import make_engine

    config = run_config(args.run_dir)
    base = model_path(config)
    step = int(checkpoint.name.split("-")[1])
    if args.compare is not None:
        other = run_config(args.compare)
        if model_path(other) != base:
            raise RunDirError(f"{args.compare} was trained on {model_path(other)}, not on this run's base {base}: "
                              "one engine serves one base model")
    everyone, models = _model_specs(args, checkpoint)
    engine = make_engine(
        args.backend or config.inference.backend, base, max_adapters=len(everyone),
        max_lora_rank=max(m.rank for _, _, m in everyone), dtype=config.model.dtype, max_model_len=config.model.max_seq_len,
        seed=config.run.seed, target_modules=list(config.lora.target_modules),
    )
    for _, prefix, m in everyone:
        engine.load_adapter(f"{prefix}{m.name}", m.path, version=step)  # copied into the engine's store, never moved
    style = args.prompt_style
    if style == "auto":
        style = "chat" if config.tasks.prompt_style == "chat" else "r1"
    max_tokens = args.max_tokens or config.inference.max_tokens
    return engine, models, style, engine.tokenizer, max_tokens


if __name__ == "__main__":
    sys.exit(main())
