"""Does the RL learn? Train the tiny population and the tiny single agent for the same steps, and
measure the students on a fixed held-out probe set of tasks that neither run ever sees.

    python -m studies.learning [--steps 20] [--samples 4] [--probes 120] [--variant default] [--keep DIR] [key=value ...]
    python -m studies.learning --score-only --keep DIR [...]     # score the runs kept in DIR again

The probe tasks come from the tiny model's own program generator with a seed no build uses, their outputs computed
by the verifier; programs the model's build drafted (and its seed tasks) are left out
(``tinycoder.task_sets.probe_tasks``). Each student answers each probe ``--samples``
times at the run's sampling temperature (``configs/tiny.yaml``); its solve rate is the fraction
judged correct. "start" is the untrained adapters (Delta W = 0, i.e. the base model), "end" the final
checkpoint of each run (population: the mean over its students). The teachers' valid-proposal rate and program complexity over time come from
each run's metrics.jsonl. Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from statistics import fmean

ROOT = Path(__file__).resolve().parents[1]

from inference import make_engine
from configs.loading import load_config
from reporting.run_dir import RunDirectory
from tinycoder import VARIANTS, ensure_model
from evaluation.task_scores import task_scores
from tinycoder.task_sets import probe_tasks
from verifier import Verifier

def log(message: str) -> None:
    print(f"[learning] {message}", file=sys.stderr, flush=True)


def solve_rate(engine, adapter: str | None, tasks: list, samples: int, temperature: float, max_tokens: int,
               verifier: Verifier) -> tuple[float, dict[str, float]]:
    """The fraction of answers judged correct, overall and per task family."""
    scores = task_scores(engine, adapter, tasks, samples, temperature, max_tokens, verifier)
    families: dict[str, list[float]] = defaultdict(list)
    for task, correct in zip(tasks, scores):
        families[task.family].append(correct / samples)
    overall = sum(scores) / (samples * len(tasks))
    return overall, {f: round(fmean(scores), 4) for f, scores in sorted(families.items())}


def train(config: str, run_dir: Path, steps: int, variant: str, overrides: list[str]) -> float:
    start = time.perf_counter()
    cmd = [sys.executable, "launch.py", "--config", config, "--run-dir", str(run_dir), "--steps", str(steps),
           f"model.tiny_variant={variant}", f"run.checkpoint_every={steps}", *overrides]
    log(" ".join(cmd[1:]))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"training run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return time.perf_counter() - start


def trajectory(run_dir: Path) -> dict[str, list[float]]:
    rows = RunDirectory(run_dir).read_metrics()
    keys = ("valid_rate", "solve_rate", "program_ast_depth", "program_cyclomatic", "program_loc", "program_variables", "coverage")
    return {k: [r[k] for r in rows] for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4, help="answers per probe task and student")
    parser.add_argument("--probes", type=int, default=120, help="held-out probe tasks")
    parser.add_argument("--variant", default="default", choices=sorted(VARIANTS))
    parser.add_argument("--keep", type=Path, default=None, help="keep the two run directories under this folder")
    parser.add_argument("--score-only", action="store_true",
                        help="score the runs already under --keep (no training; pass the overrides they ran with)")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) applied to both runs")
    args = parser.parse_args()
    if args.score_only and args.keep is None:
        parser.error("--score-only needs --keep DIR (the folder of an earlier run)")
    if args.score_only and not all((args.keep / arm / "config.yaml").is_file() for arm in ("population", "single")):
        parser.error(f"--score-only: {args.keep} holds no kept runs (population/ and single/, from an earlier --keep)")
    run = load_config(ROOT / "configs" / "tiny.yaml", args.overrides).inference

    model_dir = ensure_model(args.variant)
    verifier = Verifier()
    probes = probe_tasks(model_dir, args.probes, 4, verifier)
    log(f"{len(probes)} held-out probe tasks")
    with tempfile.TemporaryDirectory(prefix="populora-learning-") as tmp:
        runs = args.keep or Path(tmp)
        pop_dir, single_dir = runs / "population", runs / "single"
        if args.score_only:
            pop_seconds = single_seconds = 0.0
        else:
            pop_seconds = train("configs/tiny.yaml", pop_dir, args.steps, args.variant, args.overrides)
            single_seconds = train("configs/tiny-single.yaml", single_dir, args.steps, args.variant, args.overrides)
        pop_students, single_students = RunDirectory(pop_dir).final_adapters(), RunDirectory(single_dir).final_adapters()

        rank = json.loads(next(iter(pop_students.values())).joinpath("adapter_config.json").read_text())["r"]
        engine = make_engine("hf", model_dir, max_adapters=len(pop_students) + len(single_students), max_lora_rank=rank)
        start, start_families = solve_rate(engine, None, probes, args.samples, run.temperature, run.max_tokens, verifier)
        log(f"probe solve rate at the start (untrained adapters = base): {start:.3f}")
        ends, end_families = {}, {}
        for version, (member, path) in enumerate({**{f"pop-{k}": v for k, v in pop_students.items()},
                                                  **{f"single-{k}": v for k, v in single_students.items()}}.items()):
            engine.load_adapter(member, path, version + 1)
            ends[member], end_families[member] = solve_rate(engine, member, probes, args.samples, run.temperature,
                                                            run.max_tokens, verifier)
            log(f"probe solve rate of {member} after {args.steps} steps: {ends[member]:.3f}")
        pop_end = fmean(v for k, v in ends.items() if k.startswith("pop-"))
        single_end = fmean(v for k, v in ends.items() if k.startswith("single-"))
        result = {
            "steps": args.steps,
            "probe_tasks": len(probes),
            "samples_per_task": args.samples,
            "temperature": run.temperature,
            "overrides": args.overrides,
            "probe_solve_start": round(start, 4),
            "probe_solve_end": round(pop_end, 4),
            "probe_solve_end_per_student": {k: round(v, 4) for k, v in ends.items() if k.startswith("pop-")},
            "single_probe_solve_end": round(single_end, 4),
            "improvement": round(pop_end - start, 4),
            "single_improvement": round(single_end - start, 4),
            "probe_solve_per_family": {"start": start_families, **end_families},
            "population": trajectory(pop_dir),
            "single": trajectory(single_dir),
            "population_minutes": round(pop_seconds / 60, 2),
            "single_minutes": round(single_seconds / 60, 2),
        }
    engine.close()
    verifier.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
