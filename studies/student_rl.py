"""How far can RL move the tiny model's students at all? The reference point for ``studies/learning.py``.

    python -m studies.student_rl [--steps 20] [--tasks 12] [--rollouts 8] [--lr 2e-3] [--kl 0.1] [--fixed]
                               [--temperature T] [--eval-every N] [--variants serial,stale] [--is-truncation C]
                               [--no-probes]

One student adapter, no teachers, no league, no Ray: each step it answers ``--tasks`` fresh tasks drawn
from the tiny model's own program generator (the distribution the probes come from, with a seed of
their own and the probe programs removed), ``--rollouts`` times each, and takes one update of
``learners.PolicyLearner`` with the run's rewards (correct 1, wrong -0.5, malformed -1), per-task
whitened advantages, and the KL to the base. The held-out probes of ``studies/learning.py`` are scored
before and after, at the same temperature and sample count (``--no-probes``: not scored; the training
tasks still leave the probe programs out). With ``--fixed`` every step reuses the same tasks: their
training solve rate then shows whether the update learns what it is shown. So this is self-play's best
case on this base: the students get tasks from the probes' own distribution instead of the teachers'.

``--variants`` trains one fresh student per variant, side by side on the same tasks and sampling seeds:

- ``serial``: step t generates with the adapter the learner holds (version t) and trains without an
  importance weight (``rl.importance_correction: off``), as the serial loop does.
- ``stale``: one step off-policy, as ``run.max_staleness: 1``'s overlapped loop: step t generates with
  version t - 1 (step 0 with version 0) while the learner holds version t, and trains with truncated
  importance weights w_t = min(pi_old / mu, C) against the samples' behaviour log-probs
  (``rl.importance_correction: tis``, ``learners.pg_loss``).
- ``stale-off``: one step behind as ``stale``, without the correction (what the correction is for).

Per variant the training solve rate at the first and last step and its lift (last - first), and with
the correction the token means of w_t, of the truncated fraction and of KL(mu || pi_old), averaged over
the steps, and ``behind`` (mean updates of lag: 0.95 over 20 steps, step 0 being on-policy). Prints one
JSON object on its last line: the settings, per variant its results, and ``<variant>_vs_serial_lift``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

ROOT = Path(__file__).resolve().parents[1]

import torch
from transformers import AutoModelForCausalLM

from inference import make_engine
from inference.requests import GenerationRequest
from rollouts import SolveJob, learner_samples, student_samples
from studies.learning import solve_rate
from tinycoder.task_sets import generator_tasks, probe_tasks
from configs.loading import load_config
from learners.adapter_optim import AdapterOptimizers
from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig
from learners.policy_learner import PolicyLearner, UpdateConfig
from tinycoder import ensure_model
from verifier import Verifier
from verifier.families import judge_answers
from verifier.prompts import student_prompt
from planning.model_files import model_dir_argument

TRAIN_SEED = 424_242  # neither the model's corpus, its seed tasks nor the probes use it
MEMBER = "student"


@dataclass(frozen=True)
class Variant:
    """``lag``: updates between the adapter version that generates a step and the learner's (0 serial, 1 one
    step off-policy); ``correction``: the learner's ``rl.importance_correction``."""

    lag: int
    correction: str


VARIANTS = {"serial": Variant(0, "off"), "stale": Variant(1, "tis"), "stale-off": Variant(1, "off")}


def log(message: str) -> None:
    print(f"[student-rl] {message}", file=sys.stderr, flush=True)


def mean_of(rows: list[dict], key: str) -> float | None:
    values = [row[key] for row in rows if key in row]
    return round(fmean(values), 5) if values else None


def train_variant(name: str, variant: Variant, args: argparse.Namespace, cfg, model_dir: Path, engine, tasks: list,
                  probes: list, verifier: Verifier, temperature: float) -> dict:
    """Train one fresh student ``args.steps`` steps as ``variant``; its training curve, update statistics,
    seconds and (unless ``args.no_probes``) its probe solve rate at the end."""
    max_tokens = cfg.inference.max_tokens
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # wrapped in place: one per variant
    model = MultiLoRAModel(base, LoRASpec(rank=cfg.lora.rank, alpha=cfg.lora.alpha, num_slots=1), seed=0)
    learner = PolicyLearner(
        model, AdapterOptimizers(model, lr=args.lr, grad_clip=cfg.rl.grad_clip),
        PGConfig(kl_coef=args.kl, importance_correction=variant.correction, is_truncation=args.is_truncation),
        UpdateConfig(temperature=temperature), pad_token_id=0)
    train_rates, rows, curve = [], [], {}
    seconds = {"generate": 0.0, "train": 0.0}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="populora-student-rl-") as tmp:
        for step in range(args.steps):
            learner.save_adapter(0, Path(tmp) / f"v{step}")  # version `step`: the learner's before this step's update
            served = max(step - variant.lag, 0)
            engine.load_adapter(MEMBER, Path(tmp) / f"v{served}", served)
            batch = tasks[:args.tasks] if args.fixed else tasks[step * args.tasks:(step + 1) * args.tasks]
            t0 = time.perf_counter()
            outputs = engine.generate([
                GenerationRequest(MEMBER, student_prompt(t), temperature=temperature, max_tokens=max_tokens,
                                  n=args.rollouts, seed=1_000_000 + step * 1000 + i)
                for i, t in enumerate(batch)])
            seconds["generate"] += time.perf_counter() - t0
            # the system's own glue: rewards per rollout, each task's rollouts whitened together, behaviour log-probs
            solves = [SolveJob(t, i, MEMBER, student_prompt(t), gens) for i, (t, gens) in enumerate(zip(batch, outputs))]
            verdicts = judge_answers(verifier, [(s.task, g.text) for s in solves for g in s.generations])
            per_job = [verdicts[i * args.rollouts:(i + 1) * args.rollouts] for i in range(len(solves))]
            samples, extra = learner_samples(student_samples(solves, per_job, cfg.rewards), {MEMBER: 0}, {MEMBER: step},
                                             "task", variant.correction)
            t0 = time.perf_counter()
            stats = learner.step(samples)[0]
            seconds["train"] += time.perf_counter() - t0
            rows.append({**stats, **extra.get(MEMBER, {})})
            train_rates.append(round(fmean(float(v.correct) for v in verdicts), 4))
            weights = (f", IS weight {stats['is_weight']:.4f}, truncated {stats['is_truncated']:.4f}, "
                       f"behaviour KL {stats['behaviour_kl']:.5f}" if "is_weight" in stats else "")
            log(f"{name} step {step + 1} (adapter v{served}, learner v{step}): training solve rate "
                f"{train_rates[-1]:.3f}, KL {stats['kl']:.4f}{weights}")
            if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps and not args.no_probes:
                learner.save_adapter(0, Path(tmp) / "eval")
                engine.load_adapter(MEMBER, Path(tmp) / "eval", step + 1)
                curve[step + 1] = round(solve_rate(engine, MEMBER, probes, args.samples, temperature, max_tokens, verifier)[0], 4)
                log(f"{name}: probe solve rate after {step + 1} steps: {curve[step + 1]:.3f}")
        total = time.perf_counter() - started
        result = {
            "lag": variant.lag, "importance_correction": variant.correction,
            "training_solve_start": train_rates[0], "training_solve_end": train_rates[-1],
            "training_lift": round(train_rates[-1] - train_rates[0], 4), "training_solve_rate": train_rates,
            "is_weight": mean_of(rows, "is_weight"), "is_truncated": mean_of(rows, "is_truncated"),
            "behaviour_kl": mean_of(rows, "behaviour_kl"), "behind": mean_of(rows, "behind"),
            "dropped_behaviour": sum(row.get("dropped_behaviour", 0.0) for row in rows) if variant.correction == "tis" else None,
            "is_weight_per_step": [round(row["is_weight"], 5) for row in rows] if variant.correction == "tis" else None,
            "is_truncated_per_step": [round(row["is_truncated"], 5) for row in rows] if variant.correction == "tis" else None,
            "kl_to_base_end": round(rows[-1]["kl"], 5),
            "seconds": {"generate": round(seconds["generate"], 1), "train": round(seconds["train"], 1), "total": round(total, 1)},
        }
        if not args.no_probes:
            learner.save_adapter(0, Path(tmp) / "final")
            engine.load_adapter(MEMBER, Path(tmp) / "final", args.steps)
            end, families = solve_rate(engine, MEMBER, probes, args.samples, temperature, max_tokens, verifier)
            log(f"{name}: probe solve rate after {args.steps} steps: {end:.3f}")
            result.update(probe_solve_end=round(end, 4), probe_solve_curve={**curve, args.steps: round(end, 4)},
                          probe_solve_per_family_end=families)
    engine.remove_adapter(MEMBER)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=12, help="tasks per step")
    parser.add_argument("--rollouts", type=int, default=8, help="answers per task")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kl", type=float, default=0.1, help="KL coefficient to the base")
    parser.add_argument("--fixed", action="store_true", help="train on the same tasks every step")
    parser.add_argument("--variants", default="serial",
                        help=f"comma-separated, trained side by side on the same tasks: {', '.join(VARIANTS)}")
    parser.add_argument("--is-truncation", type=float, default=None,
                        help="C of the importance weights (default: configs/tiny.yaml's rl.is_truncation)")
    parser.add_argument("--eval-every", type=int, default=0, help="also score the probes every N steps (0: only at the end)")
    parser.add_argument("--probes", type=int, default=120)
    parser.add_argument("--no-probes", action="store_true", help="do not score the probes (training tasks still exclude them)")
    parser.add_argument("--samples", type=int, default=4, help="answers per probe task")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: configs/tiny.yaml's)")
    parser.add_argument("--model", type=model_dir_argument, default=None, help="model directory (default: the tiny default model)")
    args = parser.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names or len(set(names)) != len(names):
        parser.error(f"--variants takes distinct names among {', '.join(VARIANTS)}; got {args.variants!r}")
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    temperature, max_tokens, n_inputs = cfg.inference.temperature, cfg.inference.max_tokens, cfg.tasks.code_f_inputs
    temperature = temperature if args.temperature is None else args.temperature
    args.is_truncation = cfg.rl.is_truncation if args.is_truncation is None else args.is_truncation

    model_dir = args.model or ensure_model("default")
    verifier = Verifier()
    probes = probe_tasks(model_dir, args.probes, n_inputs, verifier)
    tasks = generator_tasks(verifier, args.tasks * (1 if args.fixed else args.steps), n_inputs, TRAIN_SEED,
                            {t.program for t in probes}, oversample=2)
    log(f"{len(probes)} probe tasks, {len(tasks)} training tasks, variants {', '.join(names)}")

    engine = make_engine("hf", model_dir, max_adapters=1, max_lora_rank=cfg.lora.rank)
    started = time.perf_counter()
    start, start_families = (None, None) if args.no_probes else solve_rate(
        engine, None, probes, args.samples, temperature, max_tokens, verifier)
    if start is not None:
        log(f"probe solve rate at the start: {start:.3f}")
    results = {name: train_variant(name, VARIANTS[name], args, cfg, model_dir, engine, tasks, probes, verifier, temperature)
               for name in names}
    verifier.close()
    summary = {
        "steps": args.steps, "tasks_per_step": args.tasks, "rollouts": args.rollouts, "learning_rate": args.lr,
        "kl_coef": args.kl, "fixed_tasks": args.fixed, "temperature": temperature, "is_truncation": args.is_truncation,
        "probe_tasks": len(probes), "samples_per_task": args.samples,
        "probe_solve_start": None if start is None else round(start, 4), "probe_solve_per_family_start": start_families,
        "variants": results, "seconds": round(time.perf_counter() - started, 1),
    }
    if "serial" in results:
        for name in (n for n in names if n != "serial"):
            serial = results["serial"]["training_lift"]
            summary[f"{name}_vs_serial_lift"] = round(results[name]["training_lift"] / serial, 3) if serial else None
    for name, r in results.items():
        probe = "" if "probe_solve_end" not in r else f", probes {start:.3f} -> {r['probe_solve_end']:.3f}"
        weights = "" if r["is_weight"] is None else f", IS weight {r['is_weight']:.4f}, truncated {r['is_truncated']:.4f}"
        log(f"{name}: training solve rate {r['training_solve_start']:.3f} -> {r['training_solve_end']:.3f} "
            f"(lift {r['training_lift']:+.3f}){weights}{probe}, {r['seconds']['total']:.0f} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
