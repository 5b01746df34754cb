"""Check the time plan against a real run: calibrate this CPU, plan the tiny default, run it, compare phase by phase.

0. Calibrate (``planning/calibrate.py``, in a child process, its own measurements before the run; ``--constants
   FILE`` uses a file measured earlier instead, ``--calibrate-options "--repeats 1 ..."`` shrinks it).
1. Run the embedded default (``configs/tiny.yaml``, the real system on a local Ray cluster) for ``--steps``
   steps into a temporary run directory (``launch.py --run-dir``).
2. Plan it with ``planning.time_plan`` from the calibrated constants (as ``launch.py --dry-run --constants``
   takes them; the committed ones where the file has none) and the lengths the run recorded (its token counts
   per role and valid rate: the workload, not the rates).
3. Per phase: measured (mean over the steps after the first, whose start-up costs are not the plan's) and
   planned seconds and their ratio; ``match`` and ``record`` are the plan's ``league``.

Goal: the step within 1.25x either way, every phase longer than 0.5 s within 1.5x. The last stdout line is
one JSON object: ``calibration`` (the file, its provenance and constants), ``phases`` (measured, planned, ratio),
``plan_vs_measured_step``, ``within_goal``.

    nice -n 10 python -m bench.time_plan [--steps 10] [--keep DIR] [--constants FILE | --calibrate-options "..."]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from configs import PRESETS_DIR, load_config
from planning.calibrate import calibrated
from planning.memory_plan import load_model_dims
from planning.time_plan import Cluster, Layout, lengths_from_run, measured_phase_seconds, plan_time
from reporting.run_dir import RunDirectory

STEP_GOAL, PHASE_GOAL, PHASE_FLOOR_S = 1.25, 1.5, 0.5
MEASURED_AS = {"match": "league", "record": "league"}  # recorded phase -> the plan's phase


def fold(seconds: dict[str, float]) -> dict[str, float]:
    """Recorded phases under the plan's names (``match`` and ``record`` are its ``league``)."""
    out: dict[str, float] = {}
    for name, s in seconds.items():
        out[MEASURED_AS.get(name, name)] = out.get(MEASURED_AS.get(name, name), 0.0) + s
    return out


def compare(planned: dict[str, float], measured: dict[str, float]) -> dict:
    """Per phase measured / planned and the goal's verdict (module docstring)."""
    folded = fold(measured)
    phases = {}
    for name in sorted(set(planned) | set(folded)):
        m, p = folded.get(name, 0.0), planned.get(name, 0.0)
        phases[name] = {"measured_s": round(m, 3), "planned_s": round(p, 3),
                        "plan_vs_measured": round(p / m, 3) if m > 0 else None}
    step_ratio = sum(planned.values()) / sum(folded.values())
    slow = [n for n, v in phases.items() if max(v["measured_s"], v["planned_s"]) > PHASE_FLOOR_S
            and not (v["plan_vs_measured"] and 1 / PHASE_GOAL <= v["plan_vs_measured"] <= PHASE_GOAL)]
    return {"phases": phases, "plan_vs_measured_step": round(step_ratio, 3), "phases_off_goal": slow,
            "within_goal": 1 / STEP_GOAL <= step_ratio <= STEP_GOAL and not slow}


def render_comparison(runs: dict[str, dict]) -> str:
    """Planned / measured seconds per phase of each run (``compare``'s results by run name), one table."""
    names = sorted({n for r in runs.values() for n in r["phases"]})
    lines = [f"{'phase':<12}" + "".join(f"{run + ' measured / planned / ratio':>42}" for run in runs)]
    for n in names:
        row = f"{n:<12}"
        for r in runs.values():
            v = r["phases"].get(n, {"measured_s": 0.0, "planned_s": 0.0, "plan_vs_measured": None})
            ratio = f"{v['plan_vs_measured']:.2f}" if v["plan_vs_measured"] else "-"
            row += f"{v['measured_s']:>22.2f} {v['planned_s']:>8.2f} {ratio:>10}"
        lines.append(row)
    lines.append(f"{'step':<12}" + "".join(f"{'plan / measured ' + str(r['plan_vs_measured_step']):>42}"
                                            for r in runs.values()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--keep", type=Path, help="run directory to keep (default: a temporary one)")
    parser.add_argument("--constants", type=Path, help="plan with this constants file instead of calibrating now")
    parser.add_argument("--calibrate-options", help='options of planning/calibrate.py, e.g. "--repeats 1 --rows 8"')
    args = parser.parse_args()
    config = load_config(PRESETS_DIR / "tiny.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        kinds, host, calibration = calibrated(Path(tmp) / "node.yaml", [], args.calibrate_options, args.constants, config)
        run_dir = args.keep or Path(tmp) / "run"
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        proc = subprocess.run([sys.executable, "launch.py", "--run-dir", str(run_dir), "--steps", str(args.steps), "--quiet"],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"the tiny default failed (exit {proc.returncode})")
        run = RunDirectory(run_dir)
        steps, events = run.read_metrics(), run.read_events()
    after_first = steps[1:] or steps
    lengths = lengths_from_run(after_first, "this run")
    plan = plan_time(config, load_model_dims(config), Layout(0, 0), Cluster(1, 0, "cpu"), lengths, kinds, host,
                     checkpointing=False)
    result = compare({p.name: p.seconds for p in plan.phases}, measured_phase_seconds(after_first, events))
    print(plan.render(), file=sys.stderr)
    print(render_comparison({"serial": result}), file=sys.stderr)
    print(json.dumps({"steps": len(after_first), "lengths": lengths.__dict__, "calibration": calibration, **result}))


if __name__ == "__main__":
    main()
