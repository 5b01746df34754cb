"""Quality and build time of the embedded tiny code model, measured through the project's own code.

    python -m bench.tiny_coder                      # the default variant (built first if not cached)
    python -m bench.tiny_coder --variant test --proposals 30
    python -m bench.tiny_coder --fresh              # build into a temporary cache and time the build
    python -m bench.tiny_coder --fresh --cache-dir D  # ... into D, and keep it
    python -m bench.tiny_coder --step-timing        # only: seconds per training step, float32 vs now, side by side
    python -m bench.tiny_coder --check-shipped --variant test   # rebuild into a temporary cache, compare with the shipped one

Teachers: fresh proposals for code_o / code_i (K references from a buffer that starts with the
identity seed and grows with the valid proposals, as in a run) and code_f (inputs + message for
programs proposed in this bench), sampled with the run's settings (``configs/tiny.yaml``: temperature,
new-token budget, K references, code_f inputs, rollouts per task) through ``inference.make_engine('hf', ...)``, validated by the verifier. Students: k rollouts
per valid task, judged by the verifier.

Side by side in the same run: a randomly initialised model of the same architecture and tokenizer
(its proposals, and its students on the trained model's valid tasks), so the ratios show what the
bootstrap buys. Each valid task's rho is kept with its program's size: ``structural`` holds the students' solve
rate by lines-of-code and AST-depth bin (per family and pooled, with counts), the OLS slope of the per-task teacher
reward on lines of code with its bootstrap interval and the solve ratio of 7+ lines to 1-2
(``reporting.structural_difficulty``), and ``structural_gate`` whether that gate and the regime gate hold.
Progress goes to stderr; the last stdout line is one JSON object with
``valid_rate`` (valid proposals / proposals), ``solve_rate`` (solving rollouts / rollouts on valid
tasks, all families), ``distinct_structures`` (distinct AST structures / valid code_o+code_i
proposals), ``build_minutes`` and the machine's speed: ``s_per_step`` (training seconds per step of
the build) and ``build_precision`` (float32, or bf16 autocast where the CPU has native bf16).

``--check-shipped`` rebuilds the variant into a temporary cache and measures the gates (valid and solve rates,
same sampling seed) of the rebuild and of the shipped model (``tinycoder/models/<variant>``) side by side: each
rate's difference against one standard error of a difference of two proportions; the weights are compared bit
for bit only where the shipped build's precision and machine are this machine's (float32 storage; kernels and
thread counts differ between CPU kinds). ``agree`` is true when the gates agree within one standard error (and the
weights are equal where they are compared).

``--step-timing`` times training steps on a stand-in model of the variant's shape (synthetic batches
of the corpus's mean example length), alternating: the earlier training settings (float32 on
every CPU) and now (bf16 autocast where the CPU has native bf16), each in child processes with the OpenMP settings before (libgomp's default
spin) and now (``tinycoder.BUILD_ENV``), round after round, so a busy machine slows all alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from inference import Generation, GenerationRequest, make_engine
from configs.loading import load_config
from tinycoder import BUILD_ENV, ensure_model, model_dir
from tinycoder.build import TYPICAL_EXAMPLE
from tinycoder.cache import MANIFEST
from tinycoder.model import stand_in_model
from tinycoder.line_trace import step_counts
from tinycoder.settings import VARIANTS, variant_settings
from tinycoder.train import cpu_threads, measure_step_seconds
from verifier import Task, identity_task, parse_proposal, student_prompt, teacher_prompt
from verifier.families import judge_answers, validate_proposals
from configs.schema import RewardsConfig
from reporting.structural_difficulty import all_checks, structural_gate, structural_readout
from rollouts.rewards import proposer_reward
from verifier.metrics import program_metrics, structure_hash
from verifier.sandbox import Verifier
from planning.model_files import model_dir_argument


def log(message: str) -> None:
    print(f"[bench tiny_coder] {message}", file=sys.stderr, flush=True)


@dataclass
class Sampling:
    temperature: float
    max_tokens: int
    references_k: int
    code_f_inputs: int
    rollouts_k: int

    @classmethod
    def of_run(cls, config_path: Path) -> "Sampling":
        """The sampling settings of the run that uses the model (the tiny preset by default)."""
        c = load_config(config_path)
        return cls(c.inference.temperature, c.inference.max_tokens, c.tasks.references_k, c.tasks.code_f_inputs,
                   c.tasks.rollouts_k)


@dataclass
class Outcome:
    proposals: dict[str, int] = field(default_factory=dict)
    valid: dict[str, list[Task]] = field(default_factory=dict)
    structures: list[str] = field(default_factory=list)
    rollouts: dict[str, int] = field(default_factory=dict)
    solved: dict[str, int] = field(default_factory=dict)
    judged: dict[str, int] = field(default_factory=dict)  # valid tasks the students tried, per family
    unsolved: dict[str, int] = field(default_factory=dict)  # ... of which no rollout solved
    tasks: list[dict[str, Any]] = field(default_factory=list)  # per valid task tried: family, loc, ast_depth, rho, reward

    def merge(self, other: "Outcome") -> None:
        """Pool ``other`` (another sampling seed's proposals and rollouts) into this outcome."""
        for mine, theirs in ((self.proposals, other.proposals), (self.rollouts, other.rollouts),
                             (self.solved, other.solved), (self.judged, other.judged), (self.unsolved, other.unsolved)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        for k, v in other.valid.items():
            self.valid.setdefault(k, []).extend(v)
        self.structures.extend(other.structures)
        self.tasks.extend(other.tasks)

    def unsolved_share(self) -> float | None:
        """Valid tasks that none of their k rollouts solved / valid tasks tried (the regime gate: <= 0.20)."""
        judged = sum(self.judged.values())
        return sum(self.unsolved.values()) / judged if judged else None

    def valid_rate(self) -> float:
        total = sum(self.proposals.values())
        return sum(len(v) for v in self.valid.values()) / total if total else 0.0

    def solve_rate(self) -> float | None:
        total = sum(self.rollouts.values())
        return sum(self.solved.values()) / total if total else None

    def distinct_structures(self) -> float | None:
        return len(set(self.structures)) / len(self.structures) if self.structures else None

    def per_family(self) -> dict[str, dict[str, float | int | None]]:
        out = {}
        for fam in ("code_o", "code_i", "code_f"):
            n = self.proposals.get(fam, 0)
            r = self.rollouts.get(fam, 0)
            out[fam] = {
                "proposals": n,
                "valid_rate": round(len(self.valid.get(fam, [])) / n, 3) if n else None,
                "rollouts": r,
                "solve_rate": round(self.solved.get(fam, 0) / r, 3) if r else None,
                "unsolved_share": round(self.unsolved.get(fam, 0) / self.judged[fam], 3) if self.judged.get(fam) else None,
            }
        return out


def generate(engine, prompts: list[str], s: Sampling, n: int, seed: int) -> list[list[Generation]]:
    """``n`` ``inference.Generation``s per prompt, with the run's sampling settings."""
    requests = [
        GenerationRequest(adapter=None, prompt=p, temperature=s.temperature, max_tokens=s.max_tokens, n=n, seed=seed + i)
        for i, p in enumerate(prompts)
    ]
    return engine.generate(requests)


def propose(engine, verifier: Verifier, per_family: int, s: Sampling, rng: random.Random, out: Outcome, rounds: int = 2) -> None:
    """code_o / code_i proposals in ``rounds`` (the buffer grows between them), then code_f on their programs."""
    buffers = {fam: [identity_task(fam)] for fam in ("code_o", "code_i")}
    for r in range(rounds):
        for fam in ("code_o", "code_i"):
            count = per_family // rounds + (1 if r < per_family % rounds else 0)
            prompts = [teacher_prompt(fam, rng.sample(buffers[fam], min(s.references_k, len(buffers[fam])))) for _ in range(count)]
            texts = [t[0].text for t in generate(engine, prompts, s, 1, rng.randrange(2**30))]
            proposals = [parse_proposal(fam, t) for t in texts]
            checked = validate_proposals(verifier, fam, proposals)
            out.proposals[fam] = out.proposals.get(fam, 0) + len(texts)
            for c in checked:
                if c.valid:
                    out.valid.setdefault(fam, []).append(c.task)
                    buffers[fam].append(c.task)
                    out.structures.append(structure_hash(c.task.program))
    programs = [t.program for fam in ("code_o", "code_i") for t in out.valid.get(fam, [])] or [identity_task("code_o").program]
    chosen = [rng.choice(programs) for _ in range(per_family)]
    prompts = [teacher_prompt("code_f", [Task("code_o", p, ["0"], ["0"])], n_inputs=s.code_f_inputs) for p in chosen]
    texts = [t[0].text for t in generate(engine, prompts, s, 1, rng.randrange(2**30))]
    proposals = [parse_proposal("code_f", t, program=p, n_inputs=s.code_f_inputs) for t, p in zip(texts, chosen)]
    out.proposals["code_f"] = len(texts)
    checked = validate_proposals(verifier, "code_f", proposals, programs=chosen, n_inputs=s.code_f_inputs)
    out.valid["code_f"] = [c.task for c in checked if c.valid]


def solve(engine, verifier: Verifier, tasks: dict[str, list[Task]], s: Sampling, rng: random.Random, out: Outcome,
          rewards: RewardsConfig | None = None) -> None:
    """k rollouts per valid task, judged by the verifier; each task's record (``Outcome.tasks``: its program's lines
    of code and AST depth, rho, and the population teacher's reward under ``rewards``, the run's) for the structural
    readout (``reporting.structural_difficulty``)."""
    flat = [t for fam in ("code_o", "code_i", "code_f") for t in tasks.get(fam, [])]
    if not flat:
        return
    generations = generate(engine, [student_prompt(t) for t in flat], s, s.rollouts_k, rng.randrange(2**30))
    answers = [[g.text for g in group] for group in generations]
    items = [(t, a) for t, group in zip(flat, answers) for a in group]
    rewards = rewards or RewardsConfig()
    solved_count = [0] * len(flat)
    owners = [i for i, group in enumerate(answers) for _ in group]
    for (task, _), owner, judgement in zip(items, owners, judge_answers(verifier, items)):
        out.rollouts[task.family] = out.rollouts.get(task.family, 0) + 1
        out.solved[task.family] = out.solved.get(task.family, 0) + int(judgement.correct)
        solved_count[owner] += int(bool(judgement.correct))
    steps = iter(step_counts(verifier, [(t.program, t.inputs[0]) for t in flat if t.family == "code_o"]))
    for task, group, solved, gens in zip(flat, answers, solved_count, generations):
        out.judged[task.family] = out.judged.get(task.family, 0) + 1
        out.unsolved[task.family] = out.unsolved.get(task.family, 0) + (not solved)
        rho = solved / len(group) if group else 0.0
        metrics = program_metrics(task.program)
        out.tasks.append({"family": task.family, "loc": metrics["loc"], "ast_depth": metrics["ast_depth"],
                          "rho": rho, "teacher_reward": proposer_reward(rho, rewards, single_agent=False),
                          # the share of its rollouts cut at max_tokens (a cut trace is a wrong answer)
                          "truncated": sum(g.finish_reason == "length" for g in gens) / len(gens) if gens else 0.0,
                          # a code_o task's executed steps on its input (tinycoder.line_trace.step_counts)
                          "steps": next(steps) if task.family == "code_o" else None})


REGIME_GATE = {"valid_rate": (0.85, None), "unsolved_share": (None, 0.20), "solve_rate": (0.45, 0.70),
               "held_out_probes": (0.35, None)}
"""The regime gate: a student strong enough for the paper's regime, fixed before any study: (min, max) each, on
80 proposals a family, 3 sampling seeds, k=4 rollouts, the compact prompt."""


def structure_gate(readout: dict[str, Any], regime: dict[str, Any]) -> dict[str, Any]:
    """The structural gate (``reporting.structural_difficulty.structural_gate``: >= 30 valid tasks in each bin used,
    solve at 7+ lines <= 0.6x that at 1-2, the teacher reward's slope on lines of code > 0 with its bootstrap
    interval above 0) on the readout of the pooled valid tasks, with the regime gate beside it: ``holds`` needs
    both."""
    gate = structural_gate(readout)
    return {**gate, "structural_holds": gate["holds"], "regime_gate_holds": regime["holds"],
            "holds": all_checks([gate["holds"], regime["holds"]])}


def regime_gate(out: Outcome, probes: dict[str, Any] | None) -> dict[str, Any]:
    """Each of :data:`REGIME_GATE`'s numbers with whether it holds (None: not measured), and ``holds`` for all."""
    values = {"valid_rate": out.valid_rate(), "unsolved_share": out.unsolved_share(), "solve_rate": out.solve_rate(),
              "held_out_probes": None if probes is None else probes["solve_rate"]}
    checks = {}
    for name, (low, high) in REGIME_GATE.items():
        v = values[name]
        checks[name] = {"value": _round(v), "min": low, "max": high,
                        "holds": None if v is None else (low is None or v >= low) and (high is None or v <= high)}
    verdicts = [c["holds"] for c in checks.values()]
    return {**checks, "holds": None if None in verdicts else all(verdicts)}


def held_out_probes(engine, verifier: Verifier, path: Path, args: argparse.Namespace, s: Sampling) -> dict[str, Any]:
    """The students' solve rate on the dynamics study's held-out probe tasks (``tinycoder.task_sets.probe_tasks``: a
    generator seed no build uses, less every program the model's build drafted), ``--probe-samples`` answers each,
    per task seeded; with ``--seen-probes``, beside it the rate on tasks of programs the build trained on."""
    from evaluation.task_scores import task_scores
    from tinycoder.task_sets import probe_tasks, seen_tasks

    def rate(tasks: list[Task]) -> float:
        scores = task_scores(engine, None, tasks, args.probe_samples, s.temperature, s.max_tokens, verifier)
        return round(sum(scores) / (len(tasks) * args.probe_samples), 3)

    tasks = probe_tasks(path, args.probes, 4, verifier)
    out: dict[str, Any] = {"solve_rate": rate(tasks), "tasks": len(tasks), "samples": args.probe_samples}
    if args.seen_probes > 0:
        seen = seen_tasks(path, args.seen_probes, 4, verifier)
        out.update(seen_solve_rate=rate(seen), seen_tasks=len(seen))
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def random_init_copy(path: Path, dest: Path, seed: int) -> Path:
    """The same architecture and tokenizer with random weights (the bench's baseline)."""
    config = AutoConfig.from_pretrained(path)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(path).save_pretrained(dest)
    return dest


# The default variant's earlier training settings (float32 on every CPU; everything else unchanged). The older
# "before" (batches of 6144 tokens, 0.70 of whose step cost the 4096 batches keep) is in docs/tinycoder.md. Other
# variants have no earlier settings: their "before" is their settings now.
BEFORE = {"default": {"precision": "fp32"}}


def step_seconds_here(variant: str, rounds: int) -> dict[str, float]:
    """Median seconds per training step here, the settings before and now alternating (child side)."""
    settings = variant_settings(variant)  # precision resolved for this CPU
    before = dataclasses.replace(settings.train, **BEFORE.get(variant, {}))
    torch.set_num_threads(cpu_threads())
    model = stand_in_model(settings.model, settings.vocab_size)
    times: dict[str, list[float]] = {"settings_before": [], "settings_now": []}
    for _ in range(rounds):
        times["settings_before"].append(measure_step_seconds(model, before, *TYPICAL_EXAMPLE, steps=2))
        times["settings_now"].append(measure_step_seconds(model, settings.train, *TYPICAL_EXAMPLE, steps=2))
    return {k: statistics.median(v) for k, v in times.items()}


def step_timing(variant: str, rounds: int) -> dict[str, object]:
    """Seconds per training step: {settings before, now} x {OpenMP spin before, now}, alternating child
    processes (libgomp reads its settings at start); also the build minutes each implies."""
    plain = {k: v for k, v in os.environ.items() if k not in BUILD_ENV}
    envs = {"omp_before": plain, "omp_now": {**plain, **BUILD_ENV}}
    runs: dict[str, list[float]] = {}
    for r in range(rounds):
        for omp, env in envs.items():
            out = subprocess.run([sys.executable, "-m", "bench.tiny_coder", "--variant", variant, "--step-timing-child", "2"],
                                 env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout.strip().splitlines()[-1]
            for setting, seconds in json.loads(out).items():
                runs.setdefault(f"{setting}+{omp}", []).append(seconds)
            log(f"step timing round {r + 1}/{rounds} {omp}: {out}")
    s_step = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    old = s_step["settings_before+omp_before"]
    return {
        "s_per_step": s_step,
        "ratio_vs_before": {k: round(v / old, 3) for k, v in s_step.items()},
        "threads": cpu_threads(),
        "precision_now": variant_settings(variant).train.precision,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "example_tokens": TYPICAL_EXAMPLE[0],
    }


def gates(path: Path, args: argparse.Namespace, s: "Sampling") -> Outcome:
    """Proposals and student rollouts of the model in ``path`` with the run's sampling (the trained model's gates)."""
    out = Outcome()
    rng = random.Random(args.sample_seed)
    with Verifier() as verifier:
        engine = make_engine("hf", path, max_adapters=1, max_lora_rank=8)
        propose(engine, verifier, args.proposals, s, rng, out)
        solve(engine, verifier, out.valid, s, rng, out)
        engine.close()
    return out


def check_shipped(args: argparse.Namespace) -> dict[str, object]:
    """``--check-shipped`` (module docstring)."""
    import math

    from tinycoder.shipped import SHIPPED_ROOT, read_ship_manifest, sha256_of

    shipped = read_ship_manifest(args.variant)
    if shipped is None:
        raise SystemExit(f"error: no shipped {args.variant!r} model in {SHIPPED_ROOT}")
    s = Sampling.of_run(args.config)
    tmp = Path(tempfile.mkdtemp(prefix="check-shipped-"))
    try:
        t0 = time.perf_counter()
        rebuilt = ensure_model(args.variant, 0, cache_dir=tmp / "cache")
        minutes = (time.perf_counter() - t0) / 60
        log(f"rebuilt in {minutes:.1f} min: {rebuilt}")
        results = {}
        for name, path in (("shipped", SHIPPED_ROOT / args.variant), ("rebuilt", rebuilt)):
            out = gates(path, args, s)
            results[name] = out
            log(f"{name}: valid {out.valid_rate():.3f}, solve {out.solve_rate()}")
        precision = variant_settings(args.variant).train.precision
        from tinycoder.__main__ import machine

        same_kind = shipped["precision"] == precision == "fp32" and shipped["machine"] == machine()
        weights_equal = (sha256_of(rebuilt / "model.safetensors") == shipped["files"]["model.safetensors"]) if same_kind else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def compare(rate: str, totals: tuple[int, int]) -> dict[str, object]:
        a, b = getattr(results["shipped"], rate)(), getattr(results["rebuilt"], rate)()
        if a is None or b is None or not all(totals):
            return {"shipped": a, "rebuilt": b, "se": None, "within_one_se": None}
        se = math.sqrt(a * (1 - a) / totals[0] + b * (1 - b) / totals[1])
        return {"shipped": round(a, 3), "rebuilt": round(b, 3), "se": round(se, 4), "within_one_se": abs(a - b) <= se}

    valid = compare("valid_rate", tuple(sum(results[k].proposals.values()) for k in ("shipped", "rebuilt")))
    solve = compare("solve_rate", tuple(sum(results[k].rollouts.values()) for k in ("shipped", "rebuilt")))
    agree = bool(valid["within_one_se"] and solve["within_one_se"] and weights_equal is not False)
    return {"variant": args.variant, "shipped_key": shipped["key"], "shipped_machine": shipped["machine"],
            "this_machine": machine(), "rebuild_minutes": round(minutes, 2), "valid_rate": valid, "solve_rate": solve,
            "weights_compared": same_kind, "weights_equal": weights_equal, "agree": agree}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="default", choices=sorted(VARIANTS))
    parser.add_argument("--seed", type=int, default=0, help="build seed of the model")
    parser.add_argument("--proposals", type=int, default=40, help="teacher proposals per family")
    parser.add_argument("--baseline-proposals", type=int, default=10, help="random-init proposals per family")
    parser.add_argument("--fresh", action="store_true", help="build into a temporary cache and time the build")
    parser.add_argument("--sample-seed", type=int, default=1234)
    parser.add_argument("--sample-seeds", help="comma-separated sampling seeds, pooled (the regime gate's: 1234,1,2)")
    parser.add_argument("--probes", type=int, default=0, help="held-out probe tasks (tinycoder.task_sets.probe_tasks; 0: none)")
    parser.add_argument("--probe-samples", type=int, default=4, help="answers per probe task")
    parser.add_argument("--seen-probes", type=int, default=0, help="with --probes: as many tasks of programs the build "
                        "trained on, scored beside them (tinycoder.task_sets.seen_tasks)")
    parser.add_argument("--model-dir", type=model_dir_argument, help="bench this model directory (e.g. a `python -m tinycoder "
                        "snapshot`) instead of the variant's build")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny.yaml",
                        help="the run whose sampling settings to use")
    parser.add_argument("--cache-dir", type=Path, help="with --fresh: build into (and keep) this cache root, "
                        "which must not hold the model yet")
    parser.add_argument("--step-timing", action="store_true", help="only time training steps (module docstring)")
    parser.add_argument("--step-timing-rounds", type=int, default=3)
    parser.add_argument("--step-timing-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--check-shipped", action="store_true", help="rebuild and compare with the shipped model (module docstring)")
    args = parser.parse_args(argv)
    if args.check_shipped:
        print(json.dumps(check_shipped(args)))
        return 0
    if args.step_timing_child:
        print(json.dumps(step_seconds_here(args.variant, args.step_timing_child)))
        return 0
    if args.step_timing:
        print(json.dumps({"variant": args.variant, **step_timing(args.variant, args.step_timing_rounds)}))
        return 0
    if args.cache_dir is not None and not args.fresh:
        parser.error("--cache-dir needs --fresh")
    s = Sampling.of_run(args.config)
    rewards = load_config(args.config).rewards
    sample_seeds = [int(x) for x in args.sample_seeds.split(",")] if args.sample_seeds else [args.sample_seed]
    load_before = os.getloadavg()

    tmp = Path(tempfile.mkdtemp(prefix="bench-tiny-coder-"))
    try:
        cache_dir = (args.cache_dir or tmp / "cache") if args.fresh else None
        if args.fresh and (model_dir(args.variant, args.seed, cache_dir) / MANIFEST).is_file():
            parser.error(f"--fresh: {cache_dir} already holds the model; give an empty --cache-dir")
        if args.model_dir is not None:
            path, built_here = args.model_dir, False
            manifest = json.loads((path / MANIFEST).read_text())
            build_minutes = manifest.get("build_s", manifest.get("train_s", 0.0)) / 60
            log(f"model {path} (given; {'a training save at step ' + str(manifest['step']) if 'step' in manifest else 'a build'})")
        else:
            cached = (model_dir(args.variant, args.seed, cache_dir) / MANIFEST).is_file()
            t0 = time.perf_counter()
            path = ensure_model(args.variant, args.seed, cache_dir=cache_dir)
            built_here = not cached
            manifest = json.loads((path / MANIFEST).read_text())
            build_minutes = (time.perf_counter() - t0) / 60 if built_here else manifest["build_s"] / 60
            log(f"model {path} ({'built now' if built_here else 'cached; build time from its manifest'}: {build_minutes:.1f} min)")

        trained, per_seed = Outcome(), []
        with Verifier() as verifier:
            engine = make_engine("hf", path, max_adapters=1, max_lora_rank=8)
            for sample_seed in sample_seeds:
                rng = random.Random(sample_seed)
                one = Outcome()
                t0 = time.perf_counter()
                propose(engine, verifier, args.proposals, s, rng, one)
                solve(engine, verifier, one.valid, s, rng, one, rewards)
                log(f"sampling seed {sample_seed}: valid {one.valid_rate():.3f}, solve {one.solve_rate()}, "
                    f"unsolved valid tasks {one.unsolved_share()} ({time.perf_counter() - t0:.0f} s)")
                per_seed.append({"sample_seed": sample_seed, "valid_rate": round(one.valid_rate(), 3),
                                 "solve_rate": _round(one.solve_rate()), "unsolved_share": _round(one.unsolved_share())})
                trained.merge(one)
            probes = held_out_probes(engine, verifier, path, args, s) if args.probes > 0 else None
            if probes is not None:
                log(f"held-out probes: {probes['solve_rate']} ({probes['tasks']} tasks x {probes['samples']})")
            engine.close()

            baseline = Outcome()
            if args.baseline_proposals > 0:
                rng = random.Random(sample_seeds[0])
                engine = make_engine("hf", random_init_copy(path, tmp / "random", args.seed + 1), max_adapters=1, max_lora_rank=8)
                propose(engine, verifier, args.baseline_proposals, s, rng, baseline)
                solve(engine, verifier, trained.valid, s, rng, baseline)
                engine.close()
                log(f"random init: valid {baseline.valid_rate():.2f}, solve {baseline.solve_rate()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def ratio(a: float | None, b: float | None) -> float | None:
        if a is None or b is None:
            return None
        return round(a / b, 2) if b > 0 else None

    regime, structural = regime_gate(trained, probes), structural_readout(trained.tasks)
    pooled = structural["solve_by_loc"].get("pooled", {})
    log("solve by lines of code: " + ", ".join(f"{b} {v['solve']} (n {v['n']})" for b, v in pooled.items())
        + f"; 7+ / 1-2 {structural['ratio_long_to_short']}; teacher reward per line "
        f"{structural['reward_slope_per_line']['slope']} {structural['reward_slope_per_line']['ci']}")
    cut = structural.get("truncated_by_loc", {}).get("pooled", {})
    log("rollouts cut at max_tokens by lines of code: " + ", ".join(f"{b} {v['truncated']}" for b, v in cut.items()))
    by_steps = structural.get("solve_by_steps", {}).get("code_o", {})
    log("code_o solve by executed steps: " + ", ".join(f"{b} {v['solve']} (n {v['n']})" for b, v in by_steps.items()))
    steps_by_loc = structural.get("steps_by_loc", {}).get("code_o", {})
    log("code_o mean executed steps by lines of code: " + ", ".join(f"{b} {v['steps']}" for b, v in steps_by_loc.items()))
    result = {
        "variant": args.variant,
        "valid_rate": round(trained.valid_rate(), 3),
        "solve_rate": None if trained.solve_rate() is None else round(trained.solve_rate(), 3),
        "distinct_structures": None if trained.distinct_structures() is None else round(trained.distinct_structures(), 3),
        "unsolved_share": _round(trained.unsolved_share()),
        "held_out_probes": probes,
        "regime_gate": regime,
        "structural": structural,
        "structural_gate": structure_gate(structural, regime),
        "per_sample_seed": per_seed,
        "proposals_per_family": args.proposals,
        "snapshot": {k: manifest.get(k) for k in ("step", "steps", "tokens_trained", "epochs", "loss_last_20")} if "step" in manifest else None,
        "build_minutes": round(build_minutes, 2),
        "build_measured_now": built_here,
        "build_threads": manifest.get("threads"),
        "s_per_step": manifest.get("s_per_step"),
        "build_precision": manifest.get("settings", {}).get("train", {}).get("precision", "fp32"),
        "estimated_build_minutes": None if manifest.get("estimated_build_s") is None else round(manifest["estimated_build_s"] / 60, 2),
        "build_timings_s": manifest.get("timings"),
        "per_family": trained.per_family(),
        "random_init": {
            "valid_rate": round(baseline.valid_rate(), 3),
            "solve_rate_on_same_tasks": None if baseline.solve_rate() is None else round(baseline.solve_rate(), 3),
        },
        "ratio_valid_vs_random_init": ratio(trained.valid_rate(), baseline.valid_rate()),
        "ratio_solve_vs_random_init": ratio(trained.solve_rate(), baseline.solve_rate()),
        "sampling": vars(s),
        "parameters": manifest.get("parameters"),
        "load_average_at_start": [round(x, 2) for x in load_before],
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
