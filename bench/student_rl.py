"""How far can RL move the tiny model's students at all? The reference point for ``bench/learning.py``.

    python bench/student_rl.py [--steps 20] [--tasks 12] [--rollouts 8] [--lr 2e-3] [--kl 0.1] [--fixed]
                               [--temperature T] [--eval-every N]

One student adapter, no teachers, no league, no Ray: each step it answers ``--tasks`` fresh tasks drawn
from the tiny model's own program generator (the distribution the probes come from, with a seed of
their own and the probe programs removed), ``--rollouts`` times each, and takes one update of
``learners.PolicyLearner`` with the run's rewards (correct 1, wrong -0.5, malformed -1), per-task
whitened advantages, and the KL to the base. The held-out probes of ``bench/learning.py`` are scored
before and after, at the same temperature and sample count. With ``--fixed`` every step reuses the
same tasks: their training solve rate then shows whether the update learns what it is shown.

So this is self-play's best case on this base: the students get tasks from the probes' own
distribution instead of the teachers'. Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from inference import make_engine  # noqa: E402
from inference.requests import GenerationRequest  # noqa: E402
from rollouts import SolveJob, advantage_group, student_samples  # noqa: E402
from bench.learning import generator_tasks, probe_tasks, solve_rate  # noqa: E402
from configs.loading import load_config  # noqa: E402
from learners.adapter_optim import AdapterOptimizers  # noqa: E402
from learners.batching import Sample  # noqa: E402
from learners.multi_lora import LoRASpec, MultiLoRAModel  # noqa: E402
from learners.pg_loss import PGConfig  # noqa: E402
from learners.policy_learner import PolicyLearner, UpdateConfig  # noqa: E402
from tinycoder import ensure_model  # noqa: E402
from verifier import Verifier  # noqa: E402
from verifier.families import judge_answers  # noqa: E402
from verifier.prompts import student_prompt  # noqa: E402

TRAIN_SEED = 424_242  # neither the model's corpus, its seed tasks nor the probes use it


def log(message: str) -> None:
    print(f"[student-rl] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=12, help="tasks per step")
    parser.add_argument("--rollouts", type=int, default=8, help="answers per task")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kl", type=float, default=0.1, help="KL coefficient to the base")
    parser.add_argument("--fixed", action="store_true", help="train on the same tasks every step")
    parser.add_argument("--eval-every", type=int, default=0, help="also score the probes every N steps (0: only at the end)")
    parser.add_argument("--probes", type=int, default=120)
    parser.add_argument("--samples", type=int, default=4, help="answers per probe task")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: configs/tiny.yaml's)")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the tiny default model)")
    args = parser.parse_args()
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    temperature, max_tokens, n_inputs = cfg.inference.temperature, cfg.inference.max_tokens, cfg.tasks.code_f_inputs
    temperature = temperature if args.temperature is None else args.temperature
    torch.manual_seed(0)

    model_dir = args.model or ensure_model("default")
    verifier = Verifier()
    probes = probe_tasks(model_dir, args.probes, n_inputs, verifier)
    tasks = generator_tasks(verifier, args.tasks * (1 if args.fixed else args.steps), n_inputs, TRAIN_SEED,
                            {t.program for t in probes}, oversample=2)
    log(f"{len(probes)} probe tasks, {len(tasks)} training tasks")

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = MultiLoRAModel(base, LoRASpec(rank=cfg.lora.rank, alpha=cfg.lora.alpha, num_slots=1), seed=0)
    learner = PolicyLearner(model, AdapterOptimizers(model, lr=args.lr, grad_clip=cfg.rl.grad_clip), PGConfig(kl_coef=args.kl),
                            UpdateConfig(temperature=temperature), pad_token_id=0)
    engine = make_engine("hf", model_dir, max_adapters=1, max_lora_rank=cfg.lora.rank)
    start, start_families = solve_rate(engine, None, probes, args.samples, temperature, max_tokens, verifier)
    log(f"probe solve rate at the start: {start:.3f}")

    train_rates, curve, started = [], {}, time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="populora-student-rl-") as adapter_dir:
        for step in range(args.steps):
            learner.save_adapter(0, adapter_dir)
            engine.load_adapter("student", adapter_dir, step)
            batch = tasks[:args.tasks] if args.fixed else tasks[step * args.tasks:(step + 1) * args.tasks]
            outputs = engine.generate([
                GenerationRequest("student", student_prompt(t), temperature=temperature, max_tokens=max_tokens,
                                  n=args.rollouts, seed=1_000_000 + step * 1000 + i)
                for i, t in enumerate(batch)])
            # the system's own glue: rewards per rollout, and each task's rollouts whitened together
            solves = [SolveJob(t, i, "student", student_prompt(t), gens) for i, (t, gens) in enumerate(zip(batch, outputs))]
            verdicts = judge_answers(verifier, [(s.task, g.text) for s in solves for g in s.generations])
            per_job = [verdicts[i * args.rollouts:(i + 1) * args.rollouts] for i in range(len(solves))]
            samples = [Sample(0, s.prompt_ids, s.completion_ids, s.reward, advantage_group(s, "task"))
                       for s in student_samples(solves, per_job, cfg.rewards) if s.completion_ids]
            stats = learner.step(samples)[0]
            train_rates.append(round(fmean(float(v.correct) for v in verdicts), 4))
            log(f"step {step + 1}: training solve rate {train_rates[-1]:.3f}, KL {stats['kl']:.4f}")
            if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
                learner.save_adapter(0, adapter_dir)
                engine.load_adapter("student", adapter_dir, step + 1)
                curve[step + 1] = round(solve_rate(engine, "student", probes, args.samples, temperature, max_tokens, verifier)[0], 4)
                log(f"probe solve rate after {step + 1} steps: {curve[step + 1]:.3f}")
        learner.save_adapter(0, adapter_dir)
        engine.load_adapter("student", adapter_dir, args.steps)
    train_seconds = time.perf_counter() - started
    end, end_families = solve_rate(engine, "student", probes, args.samples, temperature, max_tokens, verifier)
    log(f"probe solve rate after {args.steps} steps: {end:.3f}")
    verifier.close()
    print(json.dumps({
        "steps": args.steps, "tasks_per_step": args.tasks, "rollouts": args.rollouts, "learning_rate": args.lr,
        "kl_coef": args.kl, "fixed_tasks": args.fixed, "probe_tasks": len(probes), "samples_per_task": args.samples,
        "temperature": temperature, "probe_solve_start": round(start, 4), "probe_solve_end": round(end, 4),
        "improvement": round(end - start, 4), "probe_solve_curve": {0: round(start, 4), **curve, args.steps: round(end, 4)},
        "probe_solve_per_family": {"start": start_families, "end": end_families},
        "training_solve_rate": train_rates, "train_minutes": round(train_seconds / 60, 2),
    }))


if __name__ == "__main__":
    main()
