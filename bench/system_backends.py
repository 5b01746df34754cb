"""The default run's step time with each inference backend, back to back: what ``inference.backend: auto`` picks by.

For each backend (``hf``, ``vllm``; ``--backends``) this runs ``launch.py --steps N`` (default: the default
run, configs/tiny.yaml, 20 steps) with ``inference.backend=<backend>`` plus ``--override``s, in a fresh run
directory, one backend after the other (``--rounds`` > 1 alternates them, so machine noise hits each alike).
A step's time is the sum of its ``phase_seconds`` in metrics.jsonl (match, propose, validate, solve, update,
evolution; the driver's own step clock); ``steps_seconds`` is their sum over the N steps, ``wall_seconds``
also counts start-up (Ray, the actors, the engine) and shutdown. Both backends run the same seeded
configuration, so they do the same kind of work, though not the same tokens (different random streams).

Run with an interpreter where vLLM imports (docs/inference.md, `bash install.sh cpu-vllm`):

    OMP_NUM_THREADS=1 python -m bench.system_backends                      # 20 steps each
    python -m bench.system_backends --steps 5 --override model.tiny_variant=test

The last stdout line is one JSON object: per backend ``steps_seconds`` (the N-step time), ``wall_seconds``,
``median_step_seconds``, ``inference_seconds`` (propose + solve: the phases that generate) and, per pair,
``vllm_over_hf`` (ratio of the N-step times; above 1: transformers is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from reporting.run_dir import RunDirectory

GENERATING_PHASES = ("propose", "solve")


def log(message: str) -> None:
    print(f"[system_backends] {message}", file=sys.stderr, flush=True)


def run_once(backend: str, steps: int, overrides: list[str], workdir: Path, round_: int) -> dict:
    """One ``launch.py`` run with ``backend``; its step times from metrics.jsonl."""
    run_dir = workdir / f"{backend}-{round_}"
    env = {**os.environ}
    env.pop("RAY_ADDRESS", None)  # a local cluster of its own, as `python launch.py` starts
    cmd = [sys.executable, "launch.py", "--quiet", "--run-dir", str(run_dir), "--steps", str(steps),
           *overrides, f"inference.backend={backend}"]
    log(f"{backend}: {' '.join(cmd[1:])}")
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{backend} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = RunDirectory(run_dir).read_metrics()  # step rows only (recovery records skipped)
    step_seconds = [sum(r["phase_seconds"].values()) for r in rows]
    inference = sum(sum(r["phase_seconds"].get(p, 0.0) for p in GENERATING_PHASES) for r in rows)
    log(f"{backend}: {len(rows)} steps in {sum(step_seconds):.1f} s (wall {wall:.1f} s)")
    return {"steps_seconds": sum(step_seconds), "wall_seconds": wall, "median_step_seconds": statistics.median(step_seconds),
            "inference_seconds": inference, "steps": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per run (default: 20, the default run)")
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--rounds", type=int, default=1, help="runs per backend, alternated (median reported)")
    parser.add_argument("--override", action="append", default=[], help="dotted.key=value passed to launch.py")
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    if "vllm" in args.backends:
        from inference import vllm_available

        ok, why = vllm_available()
        if not ok:
            parser.error(f"vllm backend requested but {why}; run with the vLLM environment or --backends hf")
    results: dict[str, list[dict]] = {b: [] for b in args.backends}
    with tempfile.TemporaryDirectory(prefix="populora-system-backends-") as tmp:
        for round_ in range(args.rounds):
            for backend in args.backends:
                results[backend].append(run_once(backend, args.steps, args.override, Path(tmp), round_))
    summary: dict = {"steps": args.steps, "rounds": args.rounds, "overrides": args.override,
                     "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count()}
    for backend, runs in results.items():
        summary[backend] = {key: round(statistics.median(r[key] for r in runs), 2)
                            for key in ("steps_seconds", "wall_seconds", "median_step_seconds", "inference_seconds")}
    if {"hf", "vllm"} <= set(results):
        summary["vllm_over_hf"] = round(summary["vllm"]["steps_seconds"] / summary["hf"]["steps_seconds"], 3)
        summary["faster"] = "hf" if summary["vllm_over_hf"] > 1 else "vllm"
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
