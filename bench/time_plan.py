"""Check the time plan against a real run: plan the tiny default on this CPU, run it, compare phase by phase.

1. Run the embedded default (``configs/tiny.yaml``, the real system on a local Ray cluster) for ``--steps``
   steps into a temporary run directory (``launch.py --run-dir``).
2. Plan it with ``planning.time_plan`` from the CPU constants committed in ``planning/time_constants.py``
   (measured beforehand by ``bench/time_constants.py``, not from this run) and the lengths the run recorded
   (its token counts per role and valid rate: the workload, not the rates).
3. Per phase: measured (mean over the steps after the first, whose start-up costs are not the plan's) and
   planned seconds and their ratio; ``match`` and ``record`` are the plan's ``league``.

Goal: the step within 1.25x either way, every phase longer than 0.5 s within 1.5x. The last stdout line is
one JSON object: ``phases`` (measured, planned, ratio), ``plan_vs_measured_step``, ``within_goal``.

    nice -n 10 python bench/time_plan.py [--steps 10] [--keep DIR]
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
sys.path.insert(0, str(ROOT))

from configs import PRESETS_DIR, load_config  # noqa: E402
from planning.memory_plan import load_model_dims  # noqa: E402
from planning.time_plan import Cluster, Layout, lengths_from_run, measured_phase_seconds, plan_time  # noqa: E402
from reporting.run_dir import RunDirectory  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--keep", type=Path, help="run directory to keep (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
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
    config = load_config(PRESETS_DIR / "tiny.yaml")
    lengths = lengths_from_run(after_first, "this run")
    plan = plan_time(config, load_model_dims(config), Layout(0, 0), Cluster(1, 0, "cpu"), lengths, checkpointing=False)
    result = compare({p.name: p.seconds for p in plan.phases}, measured_phase_seconds(after_first, events))
    print(plan.render(), file=sys.stderr)
    print(json.dumps({"steps": len(after_first), "lengths": lengths.__dict__, **result}))


if __name__ == "__main__":
    main()
