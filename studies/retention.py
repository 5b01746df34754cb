"""Capability retention of every evolution operator on the tiny model: how much of its parents' behaviour a
child keeps, and how many training steps it needs to earn its parent's reward back.

    python -m studies.retention [--variant test] [--parent-steps 8] [--recovery-steps 6] [--probes 40] ...

No Ray, one process, the system's own parts (as ``studies/student_rl.py``): a ``MultiLoRAModel`` with one slot
per adapter (0: the base, Delta W = 0; 1, 2: the parents; then one child per operator), ``PolicyLearner``
updates with the run's student rewards and per-task whitened advantages, the HF engine for sampling, the
verifier for judging.

1. **Parents**: two students trained ``--parent-steps`` steps on tasks from the tiny model's program
   generator (each its own task stream). By default they are unrelated (different initial A factors, as the
   league's founding members). ``--shared-steps S`` makes them one lineage, as crossover parents are once
   the sub-population descends from its strongest members: a common ancestor trains S steps (slot a, its
   own task stream), parent b starts as its clone with fresh optimizer state (as a child does after a
   replacement), then each trains ``--parent-steps`` steps on its own stream.
2. **Children**: every operator in ``evolution.operators`` at its replacement-policy default strength
   (``evolution.replacement.DEFAULT_OPERATORS``; ``--strengths extrapolate=2.0`` sets others); mutations of
   parent a, crossovers of (a, b).
3. **Retention** on held-out probe tasks (``studies/learning.py``'s, a seed no training data uses): each
   parent answers every probe once; on those sequences (prompt + the parent's answer) the bench takes the
   tempered next-token distributions softmax(z / T) of the parent, the child and the base at every answer
   position and reports KL(parent || child) / KL(parent || base), token-averaged: below 1 the child is
   closer to its parent than the parent is to the base. For a crossover, against each parent
   (``per_parent``) and the nearer one (``kl_to_parent_over_parent_to_base``). Solve and valid
   (well-formed) rates of every adapter on the probes, ``--samples`` answers each.
4. **Recovery**: the children train ``--recovery-steps`` steps (fresh optimizer state, as after a
   replacement); each step the parents answer the same tasks without training. ``recovery_steps`` is the
   first step s (0 = as born, before any update) at which the child's mean reward over steps 0..s reaches
   its parent's over the same tasks (for a crossover, the better parent's); null if it never does.

Prints one JSON object on its last line.
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

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from inference import make_engine
from inference.requests import GenerationRequest
from rollouts import SolveJob, advantage_group, student_samples
from tinycoder.task_sets import generator_tasks, probe_tasks
from configs.loading import load_config
from evolution import operators
from evolution.replacement import DEFAULT_OPERATORS, apply_operator
from configs.operators import check_strength
from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample
from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig
from learners.policy_learner import PolicyLearner, UpdateConfig
from tinycoder import VARIANTS, ensure_model
from verifier import Verifier
from verifier.families import judge_answers
from verifier.prompts import student_prompt
from planning.model_files import model_dir_argument

TRAIN_SEEDS = (515_151, 626_262)  # the parents' task streams: neither the corpus, the seed tasks nor the probes use them
ANCESTOR_SEED = 848_484  # the common ancestor's stream under --shared-steps
RECOVERY_SEED = 737_373
BASE, PARENT_A, PARENT_B = 0, 1, 2


def log(message: str) -> None:
    print(f"[retention] {message}", file=sys.stderr, flush=True)


def significant(x: float) -> float:
    """Four significant digits (a KL ratio of 3e-5 stays 3e-5, not 0.0)."""
    return float(f"{x:.4g}")


def to_adapter(factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """MultiLoRAModel slot factors -> the PEFT-style state dict the operators take."""
    out = {}
    for path, (a, b) in factors.items():
        out[f"{path}.lora_A.weight"], out[f"{path}.lora_B.weight"] = a, b
    return out


def from_adapter(adapter: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    paths = [k[: -len(".lora_A.weight")] for k in adapter if k.endswith(".lora_A.weight")]
    return {p: (adapter[f"{p}.lora_A.weight"], adapter[f"{p}.lora_B.weight"]) for p in paths}


class Bench:
    def __init__(self, args: argparse.Namespace, names: list[str]) -> None:
        cfg = load_config(ROOT / "configs" / "tiny.yaml", [f"model.tiny_variant={args.variant}"])
        self.cfg, self.args = cfg, args
        self.temperature, self.max_tokens = cfg.inference.temperature, cfg.inference.max_tokens
        self.n_inputs = cfg.tasks.code_f_inputs
        self.model_dir = args.model_dir or ensure_model(args.variant)
        self.verifier = Verifier()
        self.names = names
        self.slots = {"base": BASE, "parent_a": PARENT_A, "parent_b": PARENT_B, **{n: 3 + i for i, n in enumerate(names)}}
        base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        spec = LoRASpec(rank=cfg.lora.rank, alpha=cfg.lora.alpha, num_slots=len(self.slots))
        self.model = MultiLoRAModel(base, spec, seed=0)
        for slot in (BASE, PARENT_A, PARENT_B):  # their initial A factors must not depend on how many children follow
            self.model.reset_slot(slot, seed=slot)
        self.learner = PolicyLearner(self.model, AdapterOptimizers(self.model, lr=args.lr, grad_clip=cfg.rl.grad_clip),
                                     PGConfig(kl_coef=args.kl), UpdateConfig(temperature=self.temperature), pad_token_id=0)
        self.engine = make_engine("hf", self.model_dir, max_adapters=len(self.slots), max_lora_rank=cfg.lora.rank)
        self.versions: dict[str, int] = {}
        self.tmp = tempfile.TemporaryDirectory(prefix="populora-retention-")

    # adapters in the engine ---------------------------------------------------------------------------
    def publish(self, names: list[str]) -> None:
        for name in names:
            if name == "base":
                continue
            path = Path(self.tmp.name) / name
            self.learner.save_adapter(self.slots[name], path)
            self.versions[name] = self.versions.get(name, 0) + 1
            self.engine.load_adapter(name, path, self.versions[name])

    def answer(self, names: list[str], tasks: list, n: int, seed: int) -> dict[str, list[list]]:
        """Each adapter's generations for every task (same sampling seeds for every adapter)."""
        requests = [GenerationRequest(None if name == "base" else name, student_prompt(t), temperature=self.temperature,
                                      max_tokens=self.max_tokens, n=n, seed=seed + 64 * i)
                    for name in names for i, t in enumerate(tasks)]
        outputs = self.engine.generate(requests)
        return {name: outputs[k * len(tasks):(k + 1) * len(tasks)] for k, name in enumerate(names)}

    def rates(self, gens: list[list], tasks: list) -> dict[str, float]:
        answers = [(t, g.text) for t, group in zip(tasks, gens) for g in group]
        verdicts = judge_answers(self.verifier, answers)
        return {"solve": round(fmean(float(v.correct) for v in verdicts), 4),
                "valid": round(fmean(float(v.well_formed) for v in verdicts), 4)}

    # one RL step on some slots; the others only answer ------------------------------------------------
    def rl_step(self, train: list[str], watch: list[str], tasks: list, seed: int) -> dict[str, float]:
        """Mean reward of every adapter in ``train`` + ``watch`` on ``tasks``; one update of the ``train`` slots."""
        names = train + watch
        outputs = self.answer(names, tasks, self.args.rollouts, seed)
        rewards, samples = {}, []
        for name in names:
            solves = [SolveJob(t, i, name, student_prompt(t), gens) for i, (t, gens) in enumerate(zip(tasks, outputs[name]))]
            verdicts = judge_answers(self.verifier, [(s.task, g.text) for s in solves for g in s.generations])
            per_job = [verdicts[i * self.args.rollouts:(i + 1) * self.args.rollouts] for i in range(len(solves))]
            made = student_samples(solves, per_job, self.cfg.rewards)
            rewards[name] = fmean(s.reward for s in made) if made else 0.0
            if name in train:
                samples += [Sample(self.slots[name], s.prompt_ids, s.completion_ids, s.reward, advantage_group(s, "task"))
                            for s in made if s.completion_ids]
        if samples:
            self.learner.step(samples)
        self.publish(train)
        return rewards

    # next-token KL --------------------------------------------------------------------------------------
    @torch.no_grad()
    def log_probs(self, slot: int, sequences: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
        """Tempered log-softmax at every answer position (predicting each answer token) of each sequence."""
        out = []
        for start in range(0, len(sequences), 8):
            chunk = sequences[start:start + 8]
            width = max(len(p) + len(c) for p, c in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for row, (p, c) in enumerate(chunk):
                ids[row, :len(p) + len(c)] = torch.tensor(p + c)
                mask[row, :len(p) + len(c)] = 1
            logits = self.model(input_ids=ids, attention_mask=mask, adapter_index=[slot] * len(chunk)).logits.float()
            for row, (p, c) in enumerate(chunk):
                positions = slice(len(p) - 1, len(p) + len(c) - 1)
                out.append(F.log_softmax(logits[row, positions] / self.temperature, dim=-1))
        return out

    @staticmethod
    def kl(p: list[torch.Tensor], q: list[torch.Tensor]) -> float:
        """Token-averaged KL(p || q) over every position of every sequence."""
        total = sum(float((lp.exp() * (lp - lq)).sum()) for lp, lq in zip(p, q))
        return total / max(1, sum(lp.shape[0] for lp in p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="default", choices=sorted(VARIANTS))
    parser.add_argument("--model-dir", type=model_dir_argument, default=None,
                        help="an already built tiny model directory (e.g. a cached one, to compare with an earlier run); "
                             "default: the variant's, built if missing")
    parser.add_argument("--parent-steps", type=int, default=8)
    parser.add_argument("--recovery-steps", type=int, default=6)
    parser.add_argument("--shared-steps", type=int, default=0,
                        help="steps of a common ancestor before the parents diverge (0: unrelated parents)")
    parser.add_argument("--tasks", type=int, default=6, help="tasks per training step")
    parser.add_argument("--rollouts", type=int, default=4, help="answers per task and adapter in training")
    parser.add_argument("--probes", type=int, default=40, help="held-out probe tasks")
    parser.add_argument("--samples", type=int, default=2, help="answers per probe task for the rates")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kl", type=float, default=0.1, help="KL coefficient to the base in the updates")
    parser.add_argument("--operators", default=",".join(operators.OPERATORS), help="comma-separated operator names")
    parser.add_argument("--strengths", default="",
                        help="NAME=VALUE,... strengths instead of the policy's defaults, e.g. extrapolate=2.0")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started = time.perf_counter()
    names = [n for n in args.operators.split(",") if n]
    unknown = sorted(set(names) - set(operators.OPERATORS))
    if unknown:
        parser.error(f"unknown operators {unknown}")
    strengths = {name: spec["strength"] for name, spec in DEFAULT_OPERATORS.items()}
    for item in filter(None, args.strengths.split(",")):
        name, _, value = item.partition("=")
        if name not in operators.OPERATORS:
            parser.error(f"--strengths: unknown operator {name!r}")
        try:
            strengths[name] = check_strength(name, value)
        except ValueError as error:
            parser.error(f"--strengths: {error}")
    bench = Bench(args, names)
    model_rank = bench.cfg.lora.rank
    # the base slot: Delta W = 0 (B = 0); every other slot starts from its own random A and B = 0
    base_factors = bench.model.slot_factors(BASE)
    bench.model.set_slot_factors(BASE, {p: (a, torch.zeros_like(b)) for p, (a, b) in base_factors.items()})

    probes = probe_tasks(bench.model_dir, args.probes, bench.n_inputs, bench.verifier)
    exclude = {t.program for t in probes}
    streams = [generator_tasks(bench.verifier, args.tasks * args.parent_steps, bench.n_inputs, seed, exclude, oversample=2)
               for seed in TRAIN_SEEDS]
    ancestor = generator_tasks(bench.verifier, args.tasks * args.shared_steps, bench.n_inputs, ANCESTOR_SEED, exclude,
                               oversample=2) if args.shared_steps > 0 else []
    recovery = generator_tasks(bench.verifier, args.tasks * (args.recovery_steps + 1), bench.n_inputs, RECOVERY_SEED, exclude,
                               oversample=2)
    log(f"model {bench.model_dir.name}, rank {model_rank}, {len(probes)} probes; parents train {args.parent_steps} steps")

    # 1. parents -----------------------------------------------------------------------------------------
    parent_curve = []
    if args.shared_steps < 0:
        parser.error("--shared-steps must be >= 0")
    bench.publish(["parent_a"])
    for step in range(args.shared_steps):
        rewards = bench.rl_step(["parent_a"], [], ancestor[step * args.tasks:(step + 1) * args.tasks], 7_000_000 + 10_000 * step)
        parent_curve.append({"ancestor": round(rewards["parent_a"], 3)})
        log(f"ancestor step {step + 1}: reward {parent_curve[-1]['ancestor']} ({time.perf_counter() - started:.0f} s)")
    if args.shared_steps > 0:
        bench.learner.replace_adapter(PARENT_B, bench.model.slot_factors(PARENT_A))
    bench.publish(["parent_a", "parent_b"])
    for step in range(args.parent_steps):
        batch = slice(step * args.tasks, (step + 1) * args.tasks)
        rewards = {}
        for name, stream in (("parent_a", streams[0]), ("parent_b", streams[1])):
            rewards.update(bench.rl_step([name], [], stream[batch], 10_000 * step + (0 if name == "parent_a" else 5000)))
        parent_curve.append({k: round(v, 3) for k, v in rewards.items()})
        log(f"parent step {step + 1}: rewards {parent_curve[-1]} ({time.perf_counter() - started:.0f} s)")
    parents = {n: to_adapter(bench.model.slot_factors(bench.slots[n])) for n in ("parent_a", "parent_b")}

    # 2. children ----------------------------------------------------------------------------------------
    summaries = {}
    for name in names:
        strength = strengths[name]
        gen = torch.Generator().manual_seed(1000 + list(operators.OPERATORS).index(name))  # the same whatever --operators
        pair = [parents["parent_a"], parents["parent_b"]] if name in operators.CROSSOVERS else [parents["parent_a"]]
        child = apply_operator(name, strength, pair, gen)
        bench.learner.replace_adapter(bench.slots[name], from_adapter(child.state_dict))
        summaries[name] = child.summary()
    bench.publish(names)
    log(f"children made ({time.perf_counter() - started:.0f} s)")

    # 3. retention on the probes -------------------------------------------------------------------------
    everyone = ["base", "parent_a", "parent_b", *names]
    probe_gens = bench.answer(everyone, probes, args.samples, seed=2_000_000)
    rates = {name: bench.rates(probe_gens[name], probes) for name in everyone}
    log(f"probe rates: { {k: v['solve'] for k, v in rates.items()} } ({time.perf_counter() - started:.0f} s)")
    sequences = {p: [(g[0].prompt_token_ids, g[0].token_ids) for g in probe_gens[p] if g and g[0].token_ids]
                 for p in ("parent_a", "parent_b")}
    logp = {(who, p): bench.log_probs(bench.slots[who], sequences[p]) for p in sequences for who in ["base", *sequences, *names]}
    kl_to_base = {p: bench.kl(logp[(p, p)], logp[("base", p)]) for p in sequences}
    # how far apart the parents are, on the same scale as the children's ratios
    between = {f"{p}_to_{q}": significant(bench.kl(logp[(p, p)], logp[(q, p)]) / kl_to_base[p]) if kl_to_base[p] > 0 else None
               for p, q in (("parent_a", "parent_b"), ("parent_b", "parent_a"))}

    # 4. recovery ----------------------------------------------------------------------------------------
    child_rewards: dict[str, list[float]] = {n: [] for n in names}
    parent_rewards: dict[str, list[float]] = {"parent_a": [], "parent_b": []}
    for step in range(args.recovery_steps + 1):
        batch = recovery[step * args.tasks:(step + 1) * args.tasks]
        train = names if step < args.recovery_steps else []  # the last batch is only answered
        rewards = bench.rl_step(train, ["parent_a", "parent_b"] + ([] if train else names), batch, 3_000_000 + 10_000 * step)
        for n in names:
            child_rewards[n].append(rewards[n])
        for p in parent_rewards:
            parent_rewards[p].append(rewards[p])
        log(f"recovery step {step}: { {k: round(v, 2) for k, v in rewards.items()} } ({time.perf_counter() - started:.0f} s)")

    def recovered_at(child: list[float], parent: list[float]) -> int | None:
        for s in range(len(child)):
            if fmean(child[:s + 1]) >= fmean(parent[:s + 1]) - 1e-9:
                return s
        return None

    result_ops = {}
    for name in names:
        crossover = name in operators.CROSSOVERS
        own = ["parent_a", "parent_b"] if crossover else ["parent_a"]
        ratios = {p: significant(bench.kl(logp[(p, p)], logp[(name, p)]) / kl_to_base[p]) if kl_to_base[p] > 0 else None
                  for p in own}
        known = [v for v in ratios.values() if v is not None]  # 0.0 is a ratio (a child as close as can be measured)
        target = max(own, key=lambda p: fmean(parent_rewards[p]))
        result_ops[name] = {
            "kind": "crossover" if crossover else "mutation",
            "strength": summaries[name]["strength"],
            "kl_to_parent_over_parent_to_base": min(known) if known else None,
            "per_parent": ratios,
            "solve": rates[name]["solve"], "valid": rates[name]["valid"],
            "recovery_steps": recovered_at(child_rewards[name], parent_rewards[target]),
            "reward_curve": [round(r, 3) for r in child_rewards[name]],
            "parent_reward_curve": [round(r, 3) for r in parent_rewards[target]],
            "max_relative_change": round(summaries[name]["max_relative_change"], 4),
            "max_truncation_error": summaries[name]["max_truncation_error"],
        }
    bench.engine.close()
    bench.verifier.close()
    print(json.dumps({
        "variant": args.variant, "model": bench.model_dir.name, "lora_rank": model_rank,
        "parent_steps": args.parent_steps, "shared_steps": args.shared_steps, "recovery_steps_max": args.recovery_steps, "tasks_per_step": args.tasks,
        "rollouts": args.rollouts, "probe_tasks": len(probes), "samples_per_probe": args.samples,
        "temperature": bench.temperature,
        "parent_kl_to_base": {k: round(v, 5) for k, v in kl_to_base.items()},
        "parents_kl_over_parent_to_base": between,
        "rates": {k: rates[k] for k in ("base", "parent_a", "parent_b")},
        "parent_training_rewards": parent_curve,
        "operators": result_ops,
        "all_below_1": all(v["kl_to_parent_over_parent_to_base"] is not None and v["kl_to_parent_over_parent_to_base"] < 1
                           for v in result_ops.values()),
        "minutes": round((time.perf_counter() - started) / 60, 2),
    }))


if __name__ == "__main__":
    main()
