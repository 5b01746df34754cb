"""The paper's dynamics, measured: the tiny population against the tiny single agent over several seeds.

    python -m studies.dynamics [--steps 150] [--seeds 3] [--keep DIR] [--probes 120] [--samples 4] [key=value ...]
    python -m studies.dynamics --report-only --keep DIR        # summary and figure of the runs kept in DIR
    python -m studies.dynamics --report-only --keep DIR --against CONTROL   # + each slope minus the other study's
    python -m studies.dynamics --steps 3 --seeds 1 --probes 6 --samples 1 model.tiny_variant=test   # smoke run

Arms: ``--population-config`` (default ``configs/tiny.yaml``, 2 teachers + 2 students) and ``--single-config``
(default ``configs/tiny-single.yaml``, one adapter proposing and solving), compute-matched per adapter: every
adapter generates and trains on the same numbers of tasks and rollouts per step in both arms (the single agent
proposes ``tasks_per_teacher`` tasks and solves them ``rollouts_k`` times, as one teacher and one student do).
``configs/tiny-dynamics.yaml`` (4 + 4) and ``configs/tiny-dynamics-single.yaml`` are the pair in the paper's regime
(docs/dynamics.md): there the population arm spends 8x the single agent's total compute.
Seed s runs both arms with ``run.seed=s``, for s in ``--first-seed`` .. ``--first-seed + --seeds - 1`` (a second,
disjoint set replicates a first); the overrides apply to both, ``--population-override`` to the population arm
alone (its size, its league and evolution: keys the single agent has no use for).

Runs are kept under ``--keep`` (default ``studies/results/dynamics``): ``population/seed-<s>`` and
``single/seed-<s>``, each a normal run directory. A finished run is reused, an interrupted one resumed from its
latest checkpoint (every 25 steps, ``checkpoint_period``), a failed one reported and left out of every mean.
The folder's ``study.json`` records what its runs ran (configs, overrides, steps, a digest of the training
code); a folder holding runs of another study is refused with the difference named.

Reports (``reporting.study``; the seed is the unit): per arm and metric the seed-mean trajectory with its 95 % band,
each seed's OLS slope per 100 steps and their mean with its t interval; the population - single slope difference per
complexity metric (Welch; the primary claim); held-out probe solve rates of ``tinycoder.task_sets.probe_tasks``'s set (every
population student, the weakest per seed, the single agent, the base), paired by task with a bootstrap over tasks and
seeds (the weakest against the weakest of as many single-agent draws); coverage at an equal number of written
programs; verdicts by one rule each way, and none quoted under 4 seeds an arm. ``--against DIR`` compares every arm's
slopes with another kept study's (``reporting.study.study_against``: learned against its frozen control, one switch
against its absence; Welch, and paired by seed where both summaries name their seeds) under ``against`` in the JSON.
``reporting.complexity_payoff`` reads each run's ``proposals.jsonl``: per window of steps the mean reward and
advantage by lines-of-code bin, the slope of the advantage on lines of code as trained with and with sequence weights
(token weights bias it negative by arithmetic) beside the raw reward's, and the share of the teacher's advantage
from invalid-vs-valid, unsolved-vs-solved and solved-vs-solved pairs, and the students' solve rate by lines of code
and by AST depth (``reporting.structural_difficulty``); per role the members' KL to the base and update norm are
trended as the entropy is. The figure ``DIR/dynamics.png`` draws complexity and solve rate over training for both arms
with seed bands. Last line: one JSON object with every slope, CI and claim verdict.

Each run starts its own Ray cluster (``RAY_ADDRESS=local``) unless ``--ray-address`` names one, so a ``ray start``
head or a test's cluster on the same machine is never joined.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from reporting.run_dir import RunDirectory
from reporting.complexity_payoff import payoff_summary
from reporting.regime import regime_by_quarter
from reporting.study import COMPLEXITY, study_against, study_summary
from tinycoder.task_sets import PROBE_SET

ARMS = ("population", "single")
TRAINING_CODE = ("actors", "checkpoints", "configs", "evolution", "inference", "learners", "rollouts", "tinycoder",
                 "verifier", "launch.py")
"""What decides a run's numbers: a study's runs must all come from the same contents of these."""
SECONDS_PER_STEP = {"population": 4.4, "single": 3.2}
"""Guesses for the first run's expected minutes (the tiny default on an idle 2-core machine) where the folder holds
no step of the arm yet (``kept_pace``); later runs use the seconds per step the study has measured (``next_pace``)."""


def kept_pace(folder: Path, arm: str) -> float | None:
    """Mean seconds per step (the sum of a step's ``phase_seconds``) over every step the folder's runs of ``arm``
    have recorded, on this machine and with these settings; None where there is none."""
    steps = [sum(row.get("phase_seconds", {}).values()) for run_dir in sorted((folder / arm).glob("seed-*"))
             for row in RunDirectory(run_dir).read_metrics()]
    return sum(steps) / len(steps) if steps else None


def next_pace(folder: Path, arm: str, finished: dict[str, float]) -> float:
    """Seconds per step to announce for the arm's next run: a run of this session that finished (its wall time over
    its steps, start-up included), else the steps the folder's runs have recorded so far (runs still going count:
    with ``--jobs 2`` the second run of an arm starts before the first ends), else the idle-machine guess."""
    return finished.get(arm) or kept_pace(folder, arm) or SECONDS_PER_STEP[arm]


def log(message: str) -> None:
    print(f"[dynamics] {message}", file=sys.stderr, flush=True)


def code_version() -> str:
    """A digest of the tracked training code (``TRAINING_CODE``) as it is in the working tree."""
    listed = subprocess.run(["git", "ls-files", "--", *TRAINING_CODE], cwd=ROOT, capture_output=True, text=True)
    files = sorted(line for line in listed.stdout.splitlines() if line.endswith((".py", ".yaml")))
    if listed.returncode != 0 or not files:  # not a git checkout: every Python file of those folders
        files = sorted(str(p.relative_to(ROOT)) for name in TRAINING_CODE for p in (ROOT / name).rglob("*.py"))
    digest = hashlib.sha256()
    for name in files:
        path = ROOT / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def clean_commit() -> str | None:
    """The checked-out commit when the tracked training code (``TRAINING_CODE``) has no uncommitted change, else None:
    a study folder records it, so that runs kept from an older tree can be finished from a checkout of it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *TRAINING_CODE], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0 or dirty.returncode != 0 or dirty.stdout.strip():
        return None
    return head.stdout.strip()


def study_identity(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "steps": args.steps,
        "population_config": (ROOT / args.population_config).read_text(),
        "single_config": (ROOT / args.single_config).read_text(),
        "overrides": list(args.overrides),
        "population_overrides": list(args.population_override),
        "code_version": code_version(),
    }


def read_other_study(folder: Path) -> dict[str, Any]:
    """The kept summary of another study (``--against``): refused, with the reason, before anything runs."""
    path = folder / "summary.json"
    if not path.is_file():
        raise SystemExit(f"error: --against {folder}: no summary.json there (run or --report-only that study first)")
    try:
        other = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: --against {path}: not JSON ({exc})") from None
    if not all(arm in other and "metrics" in other[arm] for arm in ARMS):
        raise SystemExit(f"error: --against {path}: not a dynamics study's summary (no per-arm metrics)")
    return other


def check_identity(folder: Path, identity: dict[str, Any], report_only: bool) -> None:
    """Record ``identity`` in a new study folder; refuse one whose runs ran something else (naming what)."""
    path = folder / "study.json"
    if not path.is_file():
        if report_only:
            raise SystemExit(f"error: {folder} holds no study (no study.json); run the study first")
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**identity, "commit": clean_commit()}, indent=1))  # the commit: not compared
        return
    kept = json.loads(path.read_text())
    differ = sorted(k for k in identity if kept.get(k) != identity[k])
    if report_only:
        for key in differ:
            log(f"note: the kept runs ran with another {key} than this invocation's; reporting them as they ran")
        return
    if differ:
        shown = {k: (kept.get(k), identity[k]) for k in differ if k not in ("population_config", "single_config")}
        commit = (kept.get("commit") or "")[:12]
        finish = (f" To finish the kept runs with the code they began with, run this command from a checkout of commit "
                  f"{commit} (git worktree add ../study-{commit[:8]} {commit}).") if commit and "code_version" in differ else ""
        raise SystemExit(f"error: {folder} holds runs of another study: {', '.join(differ)} differ "
                         f"({'; '.join(f'{k}: kept {a!r}, now {b!r}' for k, (a, b) in shown.items()) or 'config files changed'}). "
                         "Use another --keep folder (or --report-only to summarise the kept runs as they are)." + finish)


def run_state(run_dir: Path, steps: int) -> tuple[str, int]:
    """("finished" | "resumable" | "new" | "failed", last recorded step) of a kept run. A run whose metrics and
    checkpoint reached ``steps`` is finished even if its driver was killed while stopping."""
    if not (run_dir / "config.yaml").is_file():
        return "new", 0
    run = RunDirectory(run_dir)
    rows = run.read_metrics()
    last = rows[-1]["step"] if rows else 0
    if (run.read_status() or {}).get("state") == "failed":
        return "failed", last
    saved = latest_checkpoint_step(run_dir)
    if last >= steps and saved >= steps:
        return "finished", last
    return ("resumable", last) if saved else ("new", 0)


def checkpoint_period(steps: int) -> int:
    """``run.checkpoint_every`` of the study's runs: every 25 steps, more often in a short run (3 per run at least)."""
    return max(1, min(25, steps // 3))


def latest_checkpoint_step(run_dir: Path) -> int:
    """The step of the run's latest complete checkpoint (0 without one)."""
    from checkpoints import checkpoint_step

    checkpoint, _ = RunDirectory(run_dir).find_checkpoint()
    return checkpoint_step(checkpoint) if checkpoint is not None else 0


def train(arm: str, config: str, run_dir: Path, seed: int, steps: int, overrides: list[str],
          seconds_per_step: float, label: str, ray_address: str = "local") -> tuple[bool, float]:
    """Run (or resume) one arm's seed to ``steps``; returns (finished, seconds per step of this session)."""
    state, last = run_state(run_dir, steps)
    if state == "finished":
        log(f"{label}: finished earlier ({last} steps), reused")
        return True, 0.0
    if state == "failed":
        run = RunDirectory(run_dir)
        log(f"{label}: FAILED earlier at step {last} ({run.describe_status(run.read_status())}); "
            "left out of the means (delete the folder to run it again)")
        return False, 0.0
    if state == "resumable":
        done = latest_checkpoint_step(run_dir)
        todo = steps - done
        cmd = [sys.executable, "launch.py", "--resume", str(run_dir), "--steps", str(todo), "--quiet"]
        what = f"resuming from step {done}"
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # started but never reached a checkpoint: nothing to keep
        todo = steps
        cmd = [sys.executable, "launch.py", "--config", config, "--run-dir", str(run_dir), "--steps", str(steps),
               "--quiet", f"run.seed={seed}", f"run.checkpoint_every={checkpoint_period(steps)}", "run.dashboard=false",
               *overrides]
        what = "starting"
    log(f"{label}: {what}, {todo} steps, expected ~{todo * seconds_per_step / 60:.1f} min "
        f"({seconds_per_step:.1f} s/step)")
    start = time.perf_counter()
    # Its own local cluster unless --ray-address names one: never whatever cluster launch.py would find here.
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    done_run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done_run.returncode != 0:
        log(f"{label}: the run failed ({done_run.returncode}); left out of the means. Its end:\n"
            f"{done_run.stderr[-2000:]}")
        return False, 0.0
    log(f"{label}: done in {seconds / 60:.1f} min")
    return True, seconds / todo


def probe_scores(folder: Path, runs: dict[str, list[Path]], args: argparse.Namespace) -> dict[str, Any]:
    """Per task the correct answers (of ``--samples``) on the held-out probes, for every final student of every run
    and for the base (``reporting.study.paired_probe_difference`` pairs the arms by task); cached in
    ``folder/probes.json`` per run and checkpoint."""
    cache_path = folder / "probes.json"
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    saved = {d: latest_checkpoint_step(d) for dirs in runs.values() for d in dirs}  # each checkpoint verified once

    def key_of(run_dir: Path, member: str) -> str:
        return f"{run_dir.relative_to(folder)}:{saved[run_dir]}:{member}:{args.probes}x{args.samples}:per-task:{PROBE_SET}"

    wanted = {arm: [(d, RunDirectory(d).final_adapters()) for d in dirs] for arm, dirs in runs.items()}
    base_key = f"base:{args.probes}x{args.samples}:per-task:{PROBE_SET}"
    missing = [(d, m, p) for arm in ARMS for d, students in wanted[arm] for m, p in students.items()
               if key_of(d, m) not in cache]
    if missing or base_key not in cache:
        from evaluation.task_scores import task_scores  # the probe set and its scoring
        from tinycoder.task_sets import probe_tasks
        from configs.loading import load_config
        from inference import make_engine
        from tinycoder import ensure_model
        from verifier import Verifier

        sample_run = next(d for arm in ARMS for d in runs[arm])
        run_cfg = load_config(sample_run / "config.yaml")
        model_dir = ensure_model(run_cfg.model.tiny_variant)
        verifier = Verifier()
        tasks = probe_tasks(model_dir, args.probes, 4, verifier)
        engine = make_engine("hf", model_dir, max_adapters=max(1, len(missing)), max_lora_rank=run_cfg.lora.rank)
        temperature, max_tokens = run_cfg.inference.temperature, run_cfg.inference.max_tokens
        if base_key not in cache:
            cache[base_key] = task_scores(engine, None, tasks, args.samples, temperature, max_tokens, verifier)
            log(f"probe solve rate of the base: {sum(cache[base_key]) / (len(tasks) * args.samples):.3f}")
        for version, (run_dir, member, path) in enumerate(missing):
            name = f"m{version}"
            engine.load_adapter(name, path, version + 1)
            scores = task_scores(engine, name, tasks, args.samples, temperature, max_tokens, verifier)
            cache[key_of(run_dir, member)] = scores
            log(f"probe solve rate of {run_dir.relative_to(folder)} {member}: {sum(scores) / (len(tasks) * args.samples):.3f}")
            cache_path.write_text(json.dumps(cache, indent=1))
        cache_path.write_text(json.dumps(cache, indent=1))
        engine.close()  # its adapter store in RAM-backed storage
        verifier.close()
    return {
        **{arm: [[cache[key_of(d, m)] for m in sorted(students)] for d, students in wanted[arm]] for arm in ARMS},
        "base": cache[base_key], "samples": args.samples,
    }


def arm_records(run_dirs: list[Path]) -> tuple[Any, list[list[dict[str, Any]]]]:
    """One arm's advantage settings (its first run's ``rl``) and every run's ``proposals.jsonl`` records."""
    from configs.loading import load_config

    rl = load_config(run_dirs[0] / "config.yaml").rl
    return rl, [RunDirectory(d).read_side("proposals") for d in run_dirs]


def payoff_and_regime(run_dirs: list[Path], steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One arm's reward-for-complexity diagnostic (``reporting.complexity_payoff``) and its regime per quarter
    (``reporting.regime``: the regime rule, fixed before its study ran), from its runs' proposals.jsonl read once,
    under the advantage settings the runs trained with."""
    rl, records = arm_records(run_dirs)
    if not any(records):
        note = "no proposals.jsonl in these runs (runs older than the per-proposal records)"
        return {"note": note}, {"note": note, "holds": None}
    whiten = rl.advantage_norm == "whiten"
    return (payoff_summary(records, steps, rl.advantage_weighting, whiten),
            regime_by_quarter(records, steps, rl.advantage_weighting, whiten))


def plus_minus(value: dict[str, Any], digits: int = 2) -> str:
    """"+m+-ci" of a report entry with ``mean`` or ``difference`` and ``ci`` (nan where either is None)."""
    mean = value.get("mean", value.get("difference"))
    ci = value.get("ci")
    return f"{mean if mean is not None else math.nan:+.{digits}f}+-{ci if ci is not None else math.nan:.{digits}f}"


def arm_overrides(arm: str, args: argparse.Namespace) -> list[str]:
    """The overrides one arm runs with: the shared ones, then the population's own."""
    return [*args.overrides, *(args.population_override if arm == "population" else [])]


def settle(arm: str, seed: int, folder: Path, config: str, finished: dict[str, float], args: argparse.Namespace) -> bool:
    """Bring one arm's seed to ``args.steps`` (or, with ``--report-only``, only look); whether it finished."""
    run_dir = folder / arm / f"seed-{seed}"
    label = f"{arm} seed {seed} ({seed - args.first_seed + 1}/{args.seeds})"
    if args.report_only:
        state, last = run_state(run_dir, args.steps)
        if state not in ("finished", "new"):
            log(f"{label}: {state} at step {last}; left out")
        return state == "finished"
    ok, measured = train(arm, config, run_dir, seed, args.steps, arm_overrides(arm, args),
                         next_pace(folder, arm, finished), label, args.ray_address)
    if measured:
        finished[arm] = measured
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds of each arm: FIRST .. FIRST+N-1")
    parser.add_argument("--first-seed", type=int, default=0, metavar="FIRST",
                        help="the first seed (default 0); e.g. --first-seed 4 --seeds 4 runs a second, disjoint seed set")
    parser.add_argument("--keep", type=Path, default=ROOT / "studies" / "results" / "dynamics", help="the study folder")
    parser.add_argument("--population-config", default="configs/tiny.yaml")
    parser.add_argument("--single-config", default="configs/tiny-single.yaml")
    parser.add_argument("--probes", type=int, default=120, help="held-out probe tasks (0: no probes)")
    parser.add_argument("--samples", type=int, default=4, help="answers per probe task and student")
    parser.add_argument("--jobs", type=int, choices=(1, 2), default=1,
                        help="runs at once: 2 keeps two runs going, the next queued run starting as either ends")
    parser.add_argument("--report-only", action="store_true", help="summarise the kept runs (no training)")
    parser.add_argument("--population-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for the population arm alone (repeatable), e.g. population.teachers=4")
    parser.add_argument("--ray-address", default="local",
                        help="the Ray cluster the runs use (default 'local': each run starts its own, whatever else runs here)")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="another kept study (its summary.json): report each arm's slopes minus that study's")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) applied to both arms")
    args = parser.parse_args()
    if args.steps < 3 or args.seeds < 1 or args.first_seed < 0:
        parser.error("--steps must be >= 3 (a slope needs 3 points), --seeds >= 1 and --first-seed >= 0")
    from configs.loading import load_config

    configs = {"population": args.population_config, "single": args.single_config}
    for arm, config in configs.items():  # a bad override fails here, before any run
        load_config(ROOT / config, arm_overrides(arm, args))
    folder = args.keep.resolve()
    other = read_other_study(args.against) if args.against else None
    check_identity(folder, study_identity(args), args.report_only)

    finished: dict[str, float] = {}  # seconds per step of the runs this session finished, per arm
    usable: dict[str, list[Path]] = {arm: [] for arm in ARMS}
    failed: list[Path] = []
    # One queue of (arm, seed) runs, the slower population first within a seed; with --jobs 2 a run starts as soon
    # as either slot frees up, so the single agent's shorter run does not leave a core idle until the population's
    # ends (a seed pair waited for its slower arm before; the next seed now starts beside it).
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    queue = [(arm, seed) for seed in seeds for arm in ARMS]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(lambda job: settle(job[0], job[1], folder, configs[job[0]], finished, args), queue))
    for (arm, seed), ok in zip(queue, outcomes):
        run_dir = folder / arm / f"seed-{seed}"
        if ok:
            usable[arm].append(run_dir)
        elif run_dir.exists():
            failed.append(run_dir)
    if not all(usable[arm] for arm in ARMS):
        raise SystemExit(f"error: no finished run of {', '.join(a for a in ARMS if not usable[a])} in {folder}")

    rows = {arm: [RunDirectory(d).read_metrics() for d in usable[arm]] for arm in ARMS}
    probes = probe_scores(folder, usable, args) if args.probes > 0 else None
    seed_ids = {arm: [int(d.name.removeprefix("seed-")) for d in usable[arm]] for arm in ARMS}
    summary = study_summary(rows["population"], rows["single"], probes, seed_ids)
    diagnostics = {arm: payoff_and_regime(usable[arm], args.steps) for arm in ARMS}
    summary["complexity_payoff"] = {arm: diagnostics[arm][0] for arm in ARMS}
    summary["regime"] = {arm: diagnostics[arm][1] for arm in ARMS}
    from reporting.study_figure import draw_study

    figure = draw_study(rows["population"], rows["single"], folder / "dynamics.png")
    summary.update({
        "steps": args.steps, "seeds": {arm: len(usable[arm]) for arm in ARMS}, "first_seed": args.first_seed,
        "failed_runs": [str(p.relative_to(folder)) for p in failed], "overrides": args.overrides,
        "population_overrides": args.population_override,
        "code_version": json.loads((folder / "study.json").read_text())["code_version"],
        "figure": str(figure), "folder": str(folder),
    })
    if other is not None:
        summary["against"] = {"folder": str(args.against.resolve()), "overrides": other.get("overrides"),
                              **study_against(summary, other)}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    for arm in ARMS:
        m = summary[arm]["metrics"]
        log(f"{arm}: " + ", ".join(f"{k.removeprefix('program_')} {m[k]['slope']:+.2f}+-{m[k]['ci'] or math.nan:.2f}"
                                   for k in COMPLEXITY if m[k]["slope"] is not None)
            + f" per 100 steps (seed means, t intervals); solve {m['solve_rate']['first']} -> {m['solve_rate']['last']}")
    inter = summary["comparisons"]["population_minus_single_complexity_slope"]
    log("population - single slope: " + ", ".join(
        f"{k.removeprefix('program_')} {plus_minus(inter[k])}"
        for k in COMPLEXITY if inter[k]["difference"] is not None))
    for arm in ARMS:  # what the teacher's advantage paid for, first and last window
        payoff_of = summary["complexity_payoff"][arm]
        windows = payoff_of.get("windows") or []
        for window in (windows[:1] + windows[-1:]) if len(windows) > 1 else windows:
            shares = ", ".join(f"{k} {v['mean']:.2f}" for k, v in window["pair_shares"].items() if v["mean"] is not None)
            rewards = ", ".join(f"{b} {v['reward']:+.2f} (n {v['n']})" for b, v in window["bins"].items()
                                if v["reward"] is not None)
            log(f"{arm} steps {window['steps'][0]}-{window['steps'][1]}: advantage per line of code "
                f"{plus_minus(window['advantage_per_line'], 3)} trained with ({payoff_of['weighting']} weights), "
                f"{plus_minus(window['advantage_per_line_sequence'], 3)} with sequence weights "
                f"({'whitened' if payoff_of['whiten'] else 'centred'}); reward per line "
                f"{plus_minus(window['reward_per_line'], 3)}; reward by lines of code: {rewards}; pair shares: {shares}")
            for metric, name in (("loc", "lines of code"), ("ast_depth", "AST depth")):  # is bigger harder?
                pooled = window["solve_by_bin"][metric].get("pooled", {})
                log(f"{arm} steps {window['steps'][0]}-{window['steps'][1]}: students' solve rate by {name}: " + ", ".join(
                    f"{b} {v['solve']:.2f} (n {v['n']})" for b, v in pooled.items() if v["solve"] is not None))
    for arm in ARMS:  # how far the adapters moved: KL to the base on their own samples, the update's norm
        m = summary[arm]["metrics"]
        log(f"{arm} readouts, first -> last, slope per 100 steps: " + "; ".join(
            f"{key.replace('_', ' ')} {m[key]['first']} -> {m[key]['last']} ({m[key]['slope']:+.4f}+-{m[key]['ci'] or math.nan:.4f})"
            for key in ("teacher_kl_to_base", "student_kl_to_base", "teacher_update_norm", "student_update_norm")
            if m.get(key, {}).get("slope") is not None))
    for arm in ARMS:  # was the study in the paper's regime, quarter by quarter?
        reg = summary["regime"][arm]
        log(f"{arm} regime (unsolved share <= {reg.get('max_unsolved')}, solved-vs-solved share >= "
            f"{reg.get('min_solved_pairs')}, seed means): " + "; ".join(
                f"steps {q['steps'][0]}-{q['steps'][1]} unsolved {plus_minus(q['unsolved_share'])} solved pairs "
                f"{plus_minus(q['solved_vs_solved_share'])} ({'holds' if q['holds'] else 'fails' if q['holds'] is False else 'n/a'})"
                for q in reg.get("quarters", [])) + f": {'holds' if reg['holds'] else 'fails' if reg['holds'] is False else 'n/a'}")
    comparisons = summary["comparisons"]
    matched = comparisons["coverage_at_equal_programs"]
    log(f"coverage at {matched['programs']} written programs (each arm): population {matched['a']:.1f}, "
        f"single {matched['b']:.1f}, difference {plus_minus(matched)}; per written program (not a verdict: twice the "
        f"programs, a concave count) {plus_minus(comparisons['coverage_per_program'], 4)}")
    if "probe_weakest_member_minus_single_weakest_of_n" in comparisons:
        weak, plain = comparisons["probe_weakest_member_minus_single_weakest_of_n"], comparisons["probe_weakest_member_minus_single"]
        log(f"probes: weakest member {weak['a']:.3f} against the weakest of {weak['single_draws']} single-agent draws "
            f"{weak['b']:.3f}, difference {weak['difference']:+.3f} [{weak['lo']:+.3f}, {weak['hi']:+.3f}] "
            f"(against the single agent's one rate {plain['b']:.3f}: {plain['difference']:+.3f}, biased low)")
    for arm in ARMS if other is not None else ():
        diffs = summary["against"][arm]
        log(f"{arm} minus {args.against}: " + ", ".join(
            f"{k.removeprefix('program_')} {plus_minus(d)} ({d['verdict']}"
            + (f"; paired by {len(d['paired']['seeds'])} seeds {plus_minus(d['paired'])}, slopes' correlation "
               f"{d['paired']['correlation'] if d['paired']['correlation'] is not None else 'n/a'}"
               if d.get("paired") else "") + ")"
            for k, d in diffs.items() if k in COMPLEXITY + ("solve_rate", "valid_rate")))
    log("verdicts: " + ", ".join(f"{k} {v}" for k, v in summary["verdicts"].items())
        + ("" if summary["powered"] else f" (under {summary['min_seeds']} seeds an arm: not quoted; computed: "
           + ", ".join(f"{k} {v}" for k, v in summary["unpowered"].items()) + ")"))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
