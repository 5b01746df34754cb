"""``train(config)``: resolve the model, start the actors, run the steps, checkpoint, summarise.

Progress: one line per step (valid and solve rates, rewards, ratings, evolution, seconds) under a
tqdm bar; a summary at the end. ``--resume`` restores the latest complete checkpoint of the run
directory (adapters, optimizer states, league and lineage, buffers, RNG states) and continues.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from configs import Config
from actors.run_dir import RunDirectory

log = logging.getLogger("populora")


def resolve_model(config: Config) -> str:
    """The model directory: the built-in tiny model (built and cached on first use) or a local path."""
    if config.model.path == "tiny":
        from tinycoder import ensure_model

        return str(ensure_model(variant=config.model.tiny_variant, seed=0))
    path = Path(config.model.path).expanduser()
    if config.model.path.startswith("${") or not (path / "config.json").is_file():
        raise SystemExit(
            f"error: model.path={config.model.path!r} is not a local model directory with a config.json "
            "(models are never downloaded; set POPULORA_MODEL or override model.path=/path/to/model)"
        )
    return str(path)


def default_run_dir(config: Config) -> Path:
    return Path("runs") / f"{config.run.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def format_step(row: dict[str, Any], total: int) -> str:
    ratings = " ".join(f"{m['id']}={m['mu']:.1f}" for m in row["members"])
    evo = "".join(f" | evolved {e['child']}<-{'+'.join(e['parents'])} ({e['operator']})" for e in row["evolution"])
    seconds = sum(row["phase_seconds"].values())
    return (
        f"step {row['step']:>4}/{total} | valid {row['valid_rate']:.2f} solve {row['solve_rate']:.2f} | "
        f"reward T {row['teacher_reward']:+.2f} S {row['student_reward']:+.2f} | depth {row['program_ast_depth']:.1f} "
        f"cov {row['coverage']} | mu {ratings}{evo} | {seconds:.0f}s"
    )


def summary(rows: list[dict[str, Any]], run: RunDirectory, wall: float) -> str:
    if not rows:
        return "no steps were run"
    first, last = rows[0], rows[-1]
    events = sum(len(r["evolution"]) for r in rows)
    best = max(last["members"], key=lambda m: m["mu"] - 3 * m["sigma"])
    return "\n".join([
        f"run finished: steps {first['step']}..{last['step']} in {wall / 60:.1f} min -> {run.root}",
        f"  valid rate   {first['valid_rate']:.2f} -> {last['valid_rate']:.2f}",
        f"  solve rate   {first['solve_rate']:.2f} -> {last['solve_rate']:.2f}",
        f"  AST depth    {first['program_ast_depth']:.2f} -> {last['program_ast_depth']:.2f}; coverage {last['coverage']} n-grams",
        f"  evolution    {events} events; strongest member {best['id']} (mu {best['mu']:.2f}, sigma {best['sigma']:.2f})",
        f"  plots:       python -m actors.report {run.root}",
    ])


def train(config: Config, resume: bool = False) -> int:
    """Run ``config`` (continuing its run directory when ``resume``); returns the exit code."""
    import ray
    from tqdm import tqdm

    from actors.cluster import connect
    from actors.loop import run_step
    from actors.placement import plan_placement
    from actors.rollouts import StepPrompts
    from actors.system import System

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run = RunDirectory(config.run.run_dir or default_run_dir(config))
    start_step = 1
    checkpoint = run.latest_checkpoint() if resume else None
    if resume and checkpoint is None:
        print(f"error: {run.root} has no complete checkpoint to resume from", file=sys.stderr)
        return 2
    if checkpoint is not None:
        start_step = int(checkpoint.name.split("-")[1]) + 1
        run.truncate_metrics(start_step - 1)
    last_step = start_step - 1 + config.run.steps if resume else config.run.steps
    run.create(config.model_copy(update={"run": config.run.model_copy(update={"run_dir": run.root})}))

    model_path = resolve_model(config)
    try:  # before any actor starts: a chat style on a model without a chat template stops here
        prompts = StepPrompts.from_config(config, model_path)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[populora] prompts: style {config.tasks.prompt_style}, at most {prompts.budget} prompt tokens "
          f"(max_seq_len {config.model.max_seq_len} - max_tokens {config.inference.max_tokens})", flush=True)
    plan = plan_placement(config)
    print(f"[populora] connecting: {connect(plan.totals(verifier_on_workers=False)['CPU'])}", flush=True)
    system = System.start(config, plan, model_path)
    print(f"[populora] actors up: {', '.join(a.name for a in plan.actors if a.role != 'verifier')} "
          f"+ {config.verifier.actors} verifiers; inference backend: {system.backend}", flush=True)
    if checkpoint is not None:
        system.restore(checkpoint)
        print(f"[populora] resumed from {checkpoint}: league state equal to the saved one; continuing at step {start_step}",
              flush=True)
    else:
        system.publish_adapters(all_members=True)

    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    bar = tqdm(range(start_step, last_step + 1), desc=config.run.name, unit="step", file=sys.stderr, dynamic_ncols=True)
    try:
        for step in bar:
            row = run_step(system, step, prompts)
            run.append_metrics(row)
            system.publish_metrics(row)
            rows.append(row)
            bar.write(format_step(row, last_step))
            if step % config.run.checkpoint_every == 0 or step == last_step:
                run.save_checkpoint(step, lambda d, s=step: system.checkpoint(d, s))
    except KeyboardInterrupt:
        print(f"\n[populora] interrupted; resume with: python launch.py --resume {run.root}", file=sys.stderr)
        return 130
    finally:
        bar.close()
        run.close()
        system.stop()
        ray.shutdown()
    print(summary(rows, run, time.perf_counter() - began), flush=True)
    return 0
