"""Generation overlapped with training, measured: the tiny population serial and overlapped, side by side.

1. Run the embedded default (``configs/tiny.yaml``, the real system on a local Ray cluster) twice for ``--steps``
   steps, the same settings but ``run.max_staleness`` 0 (serial) and 1 (overlapped), one after the other in
   this invocation. Both runs set (:func:`settings`): ``rl.importance_correction=tis`` (overlap needs it; the serial
   run computes the same loss, so only the staleness differs), ``resources.inference_cpus=1`` and
   ``resources.learner_cpus=1`` (overlap on CPU needs whole cores), ``run.checkpoint_every`` and
   ``evolution.period`` beyond the run (so the only drain is the last step's, not the checkpoints' and
   evolutions'), torch threads 1 in the engine and each learner (``POPULORA_INFERENCE_THREADS``,
   ``POPULORA_LEARNER_THREADS``). Extra ``dotted.key=value`` arguments go to both runs.
2. Pin (``--no-pin`` leaves them free): while each run lasts, every thread of the engine's process is held to
   one core and every thread of both learner processes to another (``sched_setaffinity``), so the engine and
   the learners are each limited to one core, like inference and learner GPUs; the verifiers, the league, the
   driver and Ray's own processes are left free (on a 2-core machine they find no idle core while both phases
   run, which serial steps always leave them).
3. Measure from the rows' ``phase_seconds``: a serial step costs its phases; an overlapped step its train
   window (the update and, overlapped, the next step's generation), handover and evolve, plus its own
   generation only when it was generated after a drain. Step 1 (start-up costs) is never measured and
   checkpoints (the last step's) are left out of both runs.
   - steady state, steps 2..N-1: each window holds one generation and one update, none drains (f = 0): the
     figure the bound describes, ``overlap_vs_serial``;
   - the run, steps 2..N: the last step drains (it trains alone) and step 2's generation, done inside step 1's
     window, is added back, so both runs do N-1 generations and updates (f = 1 / (N-1)):
     ``overlap_vs_serial_run``.
   The two runs sample different rollouts after step 1 (one update behind), so their workloads differ a
   little: ``trained_tokens`` of each window is printed beside its seconds.
4. Plan the same with ``planning.time_plan`` (the constants ``planning/calibrate.py`` measured on this machine first,
   in a child process with the runs' settings, before either run: ``--constants FILE`` uses a file measured
   earlier, ``--calibrate-options "..."`` shrinks it; the lengths the serial run recorded; the learners sharing
   one core when pinned) and its overlap formula ``max(G, T) + f min(G, T) + R``:
   its predictions (``plan_overlap_vs_serial`` at f = 0, ``plan_overlap_vs_serial_run`` at f = 1 / (N-1),
   ``plan_overlap_bound``) are printed beside the measurement.

``overlap_vs_serial`` = steps per hour overlapped / serial (steady state); ``overlap_bound`` = 1 + min/max of
the serial run's mean generation (match, propose, validate, solve, judge, record) and train seconds over its
steady steps: the most overlap can give. Goal: ``(overlap_vs_serial - 1) >= 0.7 (overlap_bound - 1)``. Planned /
measured seconds per phase are printed for both runs (``plan_vs_measured_serial``, ``plan_vs_measured_overlapped``:
the overlapped run's phases, each measured where it ran, beside the same plan). The last stdout line is one JSON
object, with the calibration's constants under ``calibration``.

    flock /tmp/heavy.lock python -m bench.overlap [--steps 12] [--no-pin] [--keep DIR] [--constants FILE]
        [--calibrate-options "..."] [dotted.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]

from planning.calibrate import calibrated
from bench.time_plan import compare, fold, render_comparison
from configs import PRESETS_DIR, load_config
from planning.memory_plan import load_model_dims
from planning.time_plan import (
    GENERATION_PHASES, Cluster, Layout, Overlap, drained_steps, lengths_from_run, measured_phase_seconds, plan_time,
)
from reporting.run_dir import RunDirectory

GOAL_SHARE = 0.7
THREADS = {"POPULORA_INFERENCE_THREADS": "1", "POPULORA_LEARNER_THREADS": "1"}
PINNED = {"engine": "ray::InferenceActor", "learners": "ray::LearnerActor"}  # process title prefixes (Ray sets them)
EXPECTED = {"engine": 1, "learners": 2}


def settings(steps: int, extra: list[str]) -> list[str]:
    """Overrides of both runs (module docstring), the caller's last so they win."""
    beyond = steps + 1
    return ["rl.importance_correction=tis", "resources.inference_cpus=1", "resources.learner_cpus=1",
            f"run.checkpoint_every={beyond}", f"evolution.period={beyond}", f"run.steps={steps}", *extra]


class Pinner(threading.Thread):
    """Holds every thread of the engine's and the learners' processes (descendants of ``root``) to their cores,
    re-applied every half second so threads started later are held too."""

    def __init__(self, root: int, cores: dict[str, set[int]]):
        super().__init__(daemon=True)
        self.root, self.cores = root, cores
        self.pids: dict[str, set[int]] = {group: set() for group in cores}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.pin_once()

    def pin_once(self) -> None:
        try:
            processes = psutil.Process(self.root).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for process in processes:
            try:
                title = " ".join(process.cmdline())
                group = next((g for g, prefix in PINNED.items() if title.startswith(prefix)), None)
                if group is None:
                    continue
                for thread in process.threads():
                    os.sched_setaffinity(thread.id, self.cores[group])
                self.pids[group].add(process.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
                continue


def run_tiny(run_dir: Path, overrides: list[str], pin: bool) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Run the tiny default with ``overrides`` into ``run_dir``; its step rows and the pinned pids per group."""
    env = {**os.environ, **THREADS, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)  # a cluster of its own: its actors are descendants of the launch process
    proc = subprocess.Popen([sys.executable, "launch.py", "--run-dir", str(run_dir), "--quiet", *overrides],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pinner = None
    if pin:
        engine_core, learner_core = sorted(os.sched_getaffinity(0))[:2]
        pinner = Pinner(proc.pid, {"engine": {engine_core}, "learners": {learner_core}})
        pinner.start()
    out, err = proc.communicate()
    if pinner is not None:
        pinner.done.set()
        pinner.join()
    if proc.returncode != 0:
        print(out[-2000:], err[-3000:], file=sys.stderr)
        raise SystemExit(f"the tiny run {' '.join(overrides)} failed (exit {proc.returncode})")
    pids = {g: sorted(p) for g, p in pinner.pids.items()} if pinner else {}
    if pinner and any(len(pids[g]) != n for g, n in EXPECTED.items()):
        raise SystemExit(f"pinned {pids}, expected {EXPECTED} processes (titles {PINNED}): the measurement is not the "
                         "one described; rerun with --no-pin to measure unpinned")
    return RunDirectory(run_dir).read_metrics(), pids


def generation_seconds(row: dict[str, Any]) -> float:
    phases = fold(row["phase_seconds"])
    return sum(phases.get(p, 0.0) for p in GENERATION_PHASES)


def generated_ahead(row: dict[str, Any]) -> bool:
    """Whether the row's generation ran inside the previous step's train window (``staleness`` 1)."""
    return row.get("staleness", 0) == 1


def step_seconds(row: dict[str, Any]) -> float:
    """Wall seconds of the row's own step (module docstring, step 3)."""
    return sum(row["phase_seconds"].values()) - (generation_seconds(row) if generated_ahead(row) else 0.0)


def trained_tokens(rows: list[dict[str, Any]]) -> int:
    return sum(r["tokens"][role][part] for r in rows for role in ("teacher", "student") for part in ("prompt", "completion"))


def window(rows: list[dict[str, Any]], add_first_generation: bool) -> dict[str, Any]:
    """Seconds, steps per hour and trained tokens of ``rows``' steps; ``add_first_generation``: count the first
    row's generation even when it ran ahead (module docstring, step 3)."""
    seconds = sum(step_seconds(r) for r in rows)
    if add_first_generation and generated_ahead(rows[0]):
        seconds += generation_seconds(rows[0])
    return {"steps": len(rows), "seconds": round(seconds, 3), "step_s": round(seconds / len(rows), 3),
            "steps_per_hour": round(3600 * len(rows) / seconds, 2), "trained_tokens": trained_tokens(rows)}


def measured(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``rows``: steps 2..N of one run."""
    mean = fold(measured_phase_seconds(rows[:-1]))
    return {"steady": window(rows[:-1], add_first_generation=False), "run": window(rows, add_first_generation=True),
            "generation_s": round(sum(mean.get(p, 0.0) for p in GENERATION_PHASES), 3),
            "train_s": round(mean.get("train", 0.0), 3), "phases": {k: round(v, 3) for k, v in mean.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="steps of each run (the first is not measured)")
    parser.add_argument("--no-pin", action="store_true", help="leave the engine and learner processes on every core")
    parser.add_argument("--keep", type=Path, help="keep both run directories under DIR (default: temporary)")
    parser.add_argument("--from-runs", type=Path, help="measure the runs a --keep DIR holds instead of running them "
                        "(give the same --steps, pinning and settings)")
    parser.add_argument("--constants", type=Path, help="plan with this constants file instead of calibrating now")
    parser.add_argument("--calibrate-options", help='options of planning/calibrate.py, e.g. "--repeats 1 --rows 8"')
    parser.add_argument("overrides", nargs="*", metavar="dotted.key=value", help="settings of both runs")
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps must be at least 4 (step 1 is not measured, the last drains, two steady steps)")
    if args.from_runs is not None and not all((args.from_runs / name / "metrics.jsonl").is_file()
                                              for name in ("serial", "overlapped")):
        parser.error(f"--from-runs {args.from_runs}: no serial/ and overlapped/ runs there (a --keep DIR of this bench)")
    pin = not args.no_pin
    if pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("pinning needs two cores (one for the engine, one for the learners); use --no-pin")
    common = settings(args.steps, args.overrides)
    results, pids = {}, {}
    config = load_config(PRESETS_DIR / "tiny.yaml", common + ["run.max_staleness=1"])
    with tempfile.TemporaryDirectory() as tmp:
        kinds, host, calibration = calibrated(Path(tmp) / "node.yaml", common, args.calibrate_options, args.constants,
                                              config)
        base = args.from_runs or args.keep or Path(tmp)
        for name, staleness in (("serial", 0), ("overlapped", 1)):
            if args.from_runs:
                rows, pids[name] = RunDirectory(base / name).read_metrics(), "not recorded (--from-runs)"
            else:
                rows, pids[name] = run_tiny(base / name, common + [f"run.max_staleness={staleness}"], pin)
            if len(rows) != args.steps:
                raise SystemExit(f"{base / name}: {len(rows)} step rows, --steps {args.steps}")
            results[name] = rows[1:]
    serial, overlapped = measured(results["serial"]), measured(results["overlapped"])
    bound = Overlap.of(serial["phases"], 0.0).bound
    ratio = {k: serial[k]["seconds"] / overlapped[k]["seconds"] for k in ("steady", "run")}

    n = args.steps - 1
    plan = plan_time(config, load_model_dims(config), Layout(0, 0), Cluster(1, 0, "cpu"),
                     lengths_from_run(results["serial"], "the serial run"), kinds, host, checkpointing=False,
                     learner_cores=1 if pin else None)
    steady, run = plan.overlap(0.0), plan.overlap(drained_steps(config, n) / n)
    planned = {p.name: p.seconds for p in plan.phases}
    per_phase = {name: compare(planned, measured_phase_seconds(results[name][:-1])) for name in ("serial", "overlapped")}
    print(plan.render(), file=sys.stderr)
    print(render_comparison(per_phase), file=sys.stderr)
    print(json.dumps({
        "steps": args.steps, "settings": common, "pinned": pids if pin else None,
        "serial": serial, "overlapped": overlapped,
        "overlap_vs_serial": round(ratio["steady"], 4), "overlap_bound": round(bound, 4),
        "plan_overlap_vs_serial": round(steady.speedup, 4), "plan_overlap_bound": round(steady.bound, 4),
        "share_of_possible_gain": round((ratio["steady"] - 1) / (bound - 1), 4) if bound > 1 else None,
        "goal_met": ratio["steady"] - 1 >= GOAL_SHARE * (bound - 1),
        "overlap_vs_serial_run": round(ratio["run"], 4), "plan_overlap_vs_serial_run": round(run.speedup, 4),
        "share_of_possible_gain_run": round((ratio["run"] - 1) / (bound - 1), 4) if bound > 1 else None,
        "plan": run.to_dict(), "plan_vs_measured_serial": per_phase["serial"],
        "plan_vs_measured_overlapped": per_phase["overlapped"], "calibration": calibration,
    }))

if __name__ == "__main__":
    main()
