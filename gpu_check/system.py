"""The ``system`` part of ``gpu_check/check.py``: the whole loop through Ray on one GPU.

    python -m gpu_check.system                       # on a GPU machine with Ray: JSON as the last stdout line
    python -m gpu_check.system --standin             # the same on CPUs: a logical GPU, actors on their CPU path
    python -m gpu_check.system --variant default     # the tiny default's own model (builds ~10 min where not cached)

The layout is the one-GPU colocated one: ``configs/tiny.yaml`` with ``resources.colocated=true
resources.inference_gpus=1 resources.learner_gpus=1 inference.backend=hf`` (the transformers engine, which stays
awake beside the learners), ``run.checkpoint_every=2``, on a local Ray cluster this script starts with one GPU
(``ray.init(num_gpus=1)``; ``--standin`` sets ``POPULORA_GPU_STANDIN=1`` there first: Ray hands out a logical GPU and
the actors run their CPU path). The runs use the project's driver (``actors.driver.train``, what ``launch.py`` calls
after its plan; this process plans first the way ``launch.py`` does, with the GPU it sees), each in this process
attached to that cluster, so the actors can be asked and killed from here as ``tests/test_recovery.py`` does:

(a) a reference run of 6 steps: once step 1 is in metrics.jsonl every actor is asked through Ray where its tensors
    are (``LearnerActor.tensor_devices``, ``InferenceActor.tensor_devices``: read inside the actor, not assumed;
    expected ``cuda``, on the stand-in ``cpu``), the second learner's device memory after construction, before its
    first step, beyond its own LoRA slots, must be under a tenth of the base's bytes (it maps the first learner's copy
    by CUDA IPC; on the stand-in every frozen tensor must lie in the mapping of the one base file in /dev/shm instead,
    as ``tests/test_learners_shared_base.py`` proves by PSS), and the engine's adapter versions are read after every
    step (they must change every step: the adapters were handed to it);
(b) the same run with the student learner SIGKILLed once step 3 is in metrics.jsonl: the driver recovers by itself
    (one recovery record, from checkpoint step-2) and must end with the reference's adapters (safetensors bytes),
    league state and step rows; every actor's devices are asked again after the recovery;
(c) a run stopped after step 4 (``run.steps=4``), resumed with ``--resume --steps 2`` the way ``launch.py`` does it,
    must end equal likewise;
(d) the reference's mean seconds per phase (step 1, the warm-up, left out, as ``launch.py --dry-run --from-run``
    does) beside the time plan's prediction for the GPU's kind (H100, H200; ``cpu`` on the stand-in, planned for the
    CPU layout the stand-in runs), with the run's own token lengths: printed, not judged; ``plan_misses`` names the
    phases measured at more than 3x the plan and why (the tiny model on a GPU is bound by per-call overhead).

Determinism: ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` and ``POPULORA_DETERMINISTIC=1`` are set where Ray starts, so every
learner and engine actor runs ``torch.use_deterministic_algorithms(True, warn_only=True)``
(``actors.cluster.deterministic_torch``); runs must then end bitwise equal. An op with no deterministic kernel warns
in its actor's log; those warnings are collected (``determinism.nondeterministic_ops``) and only then are runs
accepted within ``TOLERANCE`` (absolute, on every adapter weight, rating and row value) instead of bitwise.

Model: ``--variant test`` by default (the tiny test model: built in ~2 min on two cores where not cached; a GPU
machine has no cache, and its build time is reported as ``model.build_s``); ``--variant default`` runs the tiny
default's own model (~10 min to build); ``--model-dir`` takes a model directory built elsewhere and carried.

Refusals, each one line on stderr and a JSON object: Ray (or tqdm, tensorboard, psutil) missing: ``status``
``not_run``, naming them and ``gpu_check/pack_deps.sh``, exit 3; no CUDA device without ``--standin``: ``not_run``,
exit 3; the layout too big for the GPU: the memory plan's verdict naming the GPU and the bytes short, before any actor
starts, exit 2 (``--gpu-memory-gib`` plans for that many GiB instead of the device's: a test hook). Where the
sandbox lacks a defence ``verifier.require`` names, the runs use ``verifier.allow_weak_sandbox=true`` and
``sandbox.verifiers`` says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


from planning.calibrate import gpu_kind
from planning.time_constants import DEVICE_KINDS
from reporting.run_dir import comparable_state
from gpu_check.check import missing_for_system, missing_line  # standard library only
from planning.model_files import model_dir_argument
LAYOUT = ["resources.colocated=true", "resources.inference_gpus=1", "resources.learner_gpus=1", "inference.backend=hf",
          "run.dashboard=false"]
DETERMINISM_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "POPULORA_DETERMINISTIC": "1"}
TOLERANCE = 1e-5
"""Absolute difference allowed on every adapter weight, rating and row value, only where an op without a
deterministic kernel was named in the actors' logs; otherwise runs must end bitwise equal."""
MISS_FACTOR = 3.0
NONDETERMINISTIC = re.compile(r"(\S+) does not have a deterministic implementation")
WHY_MISSED = {
    "propose": "the transformers engine decodes one token per Python step: kernel launches, sampling and Python per "
               "token, which the plan's FLOP and bandwidth rates (vLLM's) do not count (its own note: a lower bound)",
    "solve": "as propose: per-token overhead of the transformers engine that the plan's rates do not count",
    "train": "a tiny model's update is hundreds of small kernels and Python per micro-batch; the plan counts FLOPs at "
             "train_mfu, so the fixed cost of each pass is missing",
    "handover": "per adapter a Ray object-store round trip, files written to /dev/shm and a load into the engine's "
                "slot: fixed costs beside which the plan's bytes/bandwidth term for a few-KB adapter is nothing",
    "league": "match and record are Ray calls to the league actor and TrueSkill in Python; planned as one host constant",
    "validate": "sandbox runs at the host's verifier rate plus the pool's Ray calls and chunking",
    "judge": "as validate",
    "evolve": "a Ray round trip to the league and learners per child besides the operator's arithmetic",
    "checkpoint": "each learner writes and fsyncs its files, the driver its own, manifests and renames: fixed costs "
                  "beside the plan's bytes/bandwidth term",
}


# ----------------------------------------------------------------------------------------- one run, watched


def actor_pids() -> dict[str, int]:
    """Name -> pid of every live named actor (the GCS actor table), as ``tests/test_recovery.py`` reads it."""
    import ray

    return {info["Name"]: info["Pid"] for info in ray._private.state.actors().values()
            if info.get("Name") and info["State"] == "ALIVE" and info.get("Pid")}


class Watcher(threading.Thread):
    """Follows one run's metrics.jsonl from this process: asks the actors where their tensors are once step 1 is
    in (``devices``), reads the engine's adapter versions after every step but the last (``versions``), and with
    ``kill`` = (step, actor) SIGKILLs that actor's process once the step's row is in, then asks every actor again
    after the recovery's first step (``devices_after_recovery``)."""

    def __init__(self, run_dir: Path, names: list[str], last_step: int, kill: tuple[int, str] | None = None,
                 watch: bool = True):
        super().__init__(daemon=True)
        self.run_dir, self.names, self.last_step, self.kill, self.watch = run_dir, names, last_step, kill, watch
        self.done = threading.Event()
        self.devices: dict[str, Any] = {}
        self.devices_after_recovery: dict[str, Any] = {}
        self.versions: dict[int, dict[str, int]] = {}
        self.killed: list[int] = []
        self.errors: list[str] = []

    def ask(self, method: str) -> dict[str, Any]:
        import ray

        from actors.cluster import NAMESPACE

        out = {}
        for name in self.names:
            try:
                out[name] = ray.get(getattr(ray.get_actor(name, namespace=NAMESPACE), method).remote(), timeout=300)
            except Exception as exc:  # noqa: BLE001  (recorded; the judge then fails the part)
                out[name] = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
        return out

    def run(self) -> None:
        from reporting.run_dir import RunDirectory

        run = RunDirectory(self.run_dir)
        seen = 0
        try:
            while not self.done.is_set():
                rows = run.read_metrics()
                steps = [r["step"] for r in rows]
                if self.kill and not self.killed and self.kill[0] in steps:
                    pid = actor_pids().get(self.kill[1])
                    if pid:
                        os.kill(pid, signal.SIGKILL)
                        self.killed.append(pid)
                elif self.killed and not self.devices_after_recovery and run.read_events("recovery"):
                    restored = run.read_events("recovery")[-1].get("restored_step")
                    if restored is not None and any(s > restored for s in steps) and max(steps) < self.last_step:
                        self.devices_after_recovery = self.ask("tensor_devices")
                elif self.watch and steps and max(steps) > seen and max(steps) < self.last_step:
                    seen = max(steps)
                    if not self.devices:
                        self.devices = self.ask("tensor_devices")
                    engine = self.ask_one("inference", "adapters")
                    if engine is not None:
                        self.versions[seen] = engine
                time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def ask_one(self, name: str, method: str) -> Any:
        import ray

        from actors.cluster import NAMESPACE

        try:
            return ray.get(getattr(ray.get_actor(name, namespace=NAMESPACE), method).remote(), timeout=300)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"{name}.{method}: {type(exc).__name__}: {str(exc).strip()[:300]}")
            return None


def plan_and_resolve(config: Any, view: Any) -> tuple[Any, Any]:
    """``launch.py``'s plan of ``config`` on ``view`` (the GPU this process sees) and this machine's memory, and the
    config with its activation checkpointing resolved from it, as ``launch.run_or_plan`` passes it to ``train``."""
    import launch
    from planning.memory_plan import with_resolved_checkpointing
    from planning.run_plan import plan_run

    run_plan = plan_run(config, view, launch.host_view())
    if run_plan.memory is None or not run_plan.memory.fits:
        return run_plan, None
    return run_plan, with_resolved_checkpointing(config, run_plan.memory)


def train_run(config: Any, resume: bool = False, further_steps: int | None = None) -> tuple[int, float]:
    """``actors.driver.train`` in this process on the running Ray session (quiet; its summary to stderr, so the last
    stdout line stays this script's JSON); exit code and seconds."""
    from actors.driver import train

    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        code = train(config, resume=resume, output="quiet", further_steps=further_steps)
    return code, round(time.perf_counter() - started, 1)


def watched_run(config: Any, view: Any, names: list[str], kill: tuple[int, str] | None = None, watch: bool = True,
                resume: bool = False, further_steps: int | None = None) -> tuple[dict[str, Any], Watcher]:
    run_dir = Path(config.run.run_dir)
    run_plan, resolved = plan_and_resolve(config, view)
    if resolved is None:
        raise RuntimeError(f"{run_dir.name}: the memory plan refuses it: "
                           f"{run_plan.memory.verdict() if run_plan.memory else run_plan.memory_problem}")
    last = config.run.steps if not resume else None
    if resume:  # the step a resumed run ends at: its checkpoint's + further_steps, or its planned last (run.steps)
        from reporting.run_dir import RunDirectory

        latest = RunDirectory(run_dir).latest_checkpoint()
        last = int(latest.name.split("-")[1]) + further_steps if latest and further_steps is not None else config.run.steps
    what = f"resume to step {last}" if resume else f"{last} steps" + (f", SIGKILL {kill[1]} after step {kill[0]}" if kill else "")
    print(f"[gpu_system] {run_dir.name}: starting ({what})", file=sys.stderr, flush=True)  # a timeout's tail shows where
    watcher = Watcher(run_dir, names, last, kill, watch)
    watcher.start()
    try:
        code, seconds = train_run(resolved, resume, further_steps)
    finally:
        watcher.done.set()
        watcher.join(60)
    from reporting.run_dir import RunDirectory

    print(f"[gpu_system] {run_dir.name}: exit {code} after {seconds:.1f} s", file=sys.stderr, flush=True)
    run = RunDirectory(run_dir)
    return {"exit_code": code, "seconds": seconds, "steps": [r["step"] for r in run.read_metrics()],
            "status": run.read_status(), "recoveries": run.read_events("recovery")}, watcher


# ----------------------------------------------------------------------------------------- comparisons


def max_difference(a: Any, b: Any, path: str = "") -> tuple[float, str | None]:
    """The largest absolute difference between two JSON values' numbers, and the first place where they differ in
    anything but a number's value (None when only numbers differ)."""
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or a is None:
        return 0.0, None if a == b else path or "/"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)), None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return 0.0, f"{path}/{{{', '.join(sorted(set(a) ^ set(b)))}}}"
        worst, where = 0.0, None
        for key in a:
            diff, bad = max_difference(a[key], b[key], f"{path}/{key}")
            worst, where = max(worst, diff), where or bad
        return worst, where
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return 0.0, f"{path} (length {len(a)} vs {len(b)})"
        worst, where = 0.0, None
        for i, (x, y) in enumerate(zip(a, b)):
            diff, bad = max_difference(x, y, f"{path}/{i}")
            worst, where = max(worst, diff), where or bad
        return worst, where
    return 0.0, None if a == b else path or "/"


def compare(reference: tuple, other: tuple, tolerance_allowed: bool) -> dict[str, Any]:
    """``equal``: ``bitwise`` (league, adapter bytes and rows identical), ``within_tolerance`` (every number within
    ``TOLERANCE``, accepted only with ``tolerance_allowed``: an op without a deterministic kernel ran) or
    ``different``; with the largest differences and the first structural one."""
    if reference == other:
        return {"equal": "bitwise", "passed": True}
    import torch
    from safetensors.torch import load as load_safetensors

    league_diff, league_where = max_difference(reference[0], other[0], "league")
    rows_diff, rows_where = max_difference(reference[2], other[2], "rows")
    adapter_diff, adapter_where = 0.0, None
    if set(reference[1]) != set(other[1]):
        adapter_where = f"adapter files differ: {sorted(set(reference[1]) ^ set(other[1]))}"
    else:
        for name, data in reference[1].items():
            mine, theirs = load_safetensors(data), load_safetensors(other[1][name])
            if set(mine) != set(theirs):
                adapter_where = adapter_where or f"{name}: tensors differ"
                continue
            for key in mine:
                adapter_diff = max(adapter_diff, float((mine[key].double() - theirs[key].double()).abs().max()))
    structural = league_where or rows_where or adapter_where
    worst = max(league_diff, rows_diff, adapter_diff)
    within = structural is None and worst <= TOLERANCE
    return {"equal": "within_tolerance" if within else "different", "passed": within and tolerance_allowed,
            "max_difference": {"league": league_diff, "rows": rows_diff, "adapters": adapter_diff},
            "first_structural_difference": structural, "tolerance": TOLERANCE,
            **({} if tolerance_allowed or not within else
               {"why_not_accepted": "no op without a deterministic kernel was named: the runs should be bitwise equal"}),
            "torch": torch.__version__}


def nondeterministic_ops(log_dir: Path) -> list[str]:
    """The ops that warned ``... does not have a deterministic implementation`` in the actors' logs."""
    found: set[str] = set()
    for path in log_dir.glob("*.log") if log_dir.is_dir() else []:
        found |= set(NONDETERMINISTIC.findall(path.read_text(errors="replace")))
    return sorted(found)


# ----------------------------------------------------------------------------------------- judging the parts


def on_device(reports: dict[str, Any], expected: str) -> tuple[bool, list[str]]:
    """Whether every actor's tensors are all on ``expected`` (``cuda`` matches ``cuda:<i>``); the problems."""
    problems = []
    if not reports:
        return False, ["no actor was asked"]
    for name, report in reports.items():
        devices = report.get("devices")
        if not devices:
            problems.append(f"{name}: {report.get('error') or report.get('reason') or 'no devices reported'}")
        elif any(d.split(":")[0] != expected for d in devices):
            problems.append(f"{name}: tensors on {devices}, expected {expected}")
    return not problems, problems


def one_base(reports: dict[str, Any], learners: list[str], on_cuda: bool) -> dict[str, Any]:
    """The two learners hold one base copy: on CUDA the second learner's memory after construction, beyond its own
    LoRA slots, under a tenth of the base's bytes (and after mapping the base alone too, as the CUDA IPC test checks);
    on the stand-in every frozen tensor in the mapping of the one base file. Both: each learner's frozen tensors within
    one span of the base's bytes (views of one buffer)."""
    got = {name: reports.get(name, {}) for name in learners}
    if any("base_bytes" not in r for r in got.values()):
        return {"passed": False, "reason": f"a learner did not report: {got}"}
    base = next(iter(got.values()))["base_bytes"]
    spans = {name: r["base_span"] for name, r in got.items()}
    out: dict[str, Any] = {"base_bytes": base, "limit_bytes": base // 10, "base_span": spans,
                           "held": {name: r["base_held"] for name, r in got.items()}}
    views = all(span <= base for span in spans.values())
    if on_cuda:
        second = next((n for n, r in got.items() if "IPC mapping" in r["base_held"]), None)
        if second is None:
            return {**out, "passed": False, "reason": "no learner maps another's base by CUDA IPC"}
        r = got[second]
        extra = r["allocated_after_construction"] - r["own_bytes"]
        out.update({"second_learner": second, "allocated_after_base": r["allocated_after_base"],
                    "allocated_after_construction": r["allocated_after_construction"], "own_lora_bytes": r["own_bytes"],
                    "extra_bytes": extra,
                    "passed": views and extra < base / 10 and r["allocated_after_base"] < base / 10})
    else:
        out.update({"second_learner": learners[-1], "extra_bytes": None,
                    "in_shared_file": {name: r["in_shared_file"] for name, r in got.items()},
                    "how": "stand-in: device memory is not measured (the learners run on the CPU); every frozen tensor "
                           "of both learners lies in the mapping of the machine's one base file in /dev/shm",
                    "passed": views and all(r["in_shared_file"] for r in got.values())})
    return out


def handed_over(versions: dict[int, dict[str, int]], adapters: int) -> dict[str, Any]:
    """The engine's adapter versions after each step: every step changed them (new versions were loaded) and the
    engine serves every member."""
    steps = sorted(versions)
    changed = [versions[a] != versions[b] for a, b in zip(steps, steps[1:])]
    return {"versions_after_step": {str(s): versions[s] for s in steps},
            "passed": len(steps) >= 2 and all(changed) and all(len(versions[s]) == adapters for s in steps)}


def phase_table(config: Any, overrides: list[str], view: Any, rows: list[dict], events: list[dict], kind: str | None,
                standin: bool) -> dict[str, Any]:
    """(d): measured mean seconds per phase beside the time plan's, for ``kind`` (the stand-in: the CPU layout that
    it runs, ``config``'s ``overrides`` without GPUs)."""
    from configs import load_config
    from planning.run_plan import plan_run
    from planning.time_plan import lengths_from_run, measured_phase_seconds

    import launch

    steps = rows[1:] or rows
    measured = measured_phase_seconds(steps, events)
    lengths = lengths_from_run(steps, "the reference run")
    if standin:
        planned_config = load_config(None, [*overrides, f"run.steps={config.run.steps}", "resources.inference_gpus=0",
                                            "resources.learner_gpus=0"])
        described, planned_for = None, "cpu (the stand-in runs the CPU layout)"
    else:
        planned_config, described = config, f"1x{kind or config.plan.gpu_kind}"
        planned_for = described + ("" if kind else f" (the GPU's kind is not one the plan knows: planned as "
                                                   f"{config.plan.gpu_kind})")
    run_plan = plan_run(planned_config, view, launch.host_view(), described, lengths)
    if run_plan.time is None:
        return {"planned_for": planned_for, "measured_s": measured, "planned_s": None, "problem": run_plan.time_problem}
    planned = {p.name: p.seconds for p in run_plan.time.current.phases}
    merged = dict(measured)
    if "league" in planned:  # the plan's league phase is the loop's match + record
        merged["league"] = measured.get("match", 0.0) + measured.get("record", 0.0)
    table = {name: {"measured_s": round(merged[name], 4) if name in merged else None, "planned_s": round(planned[name], 4)}
             for name in planned}
    for name in sorted(set(measured) - set(planned) - {"match", "record"}):
        table[name] = {"measured_s": round(measured[name], 4), "planned_s": None}
    misses = {name: WHY_MISSED.get(name, "per-call overhead (Ray round trips, Python) that the plan's rates do not count")
              for name, t in table.items() if t["measured_s"] is not None and t["planned_s"] is not None
              and t["measured_s"] > 0.05 and t["measured_s"] > MISS_FACTOR * t["planned_s"]}
    unplanned = {name: "recorded by the loop, not a phase of the plan" for name, t in table.items() if t["planned_s"] is None}
    return {"planned_for": planned_for, "lengths": lengths.source, "phases": table,
            "step_s": {"measured": round(sum(t["measured_s"] or 0.0 for t in table.values()), 3),
                       "planned": round(run_plan.time.current.step_seconds, 3)},
            "plan_misses": misses, "unplanned": unplanned, "notes": list(run_plan.time.current.notes)}


# ----------------------------------------------------------------------------------------- main


PARTS = ("a", "b", "c", "d")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--standin", action="store_true",
                        help="CPU stand-in mode: a logical GPU, POPULORA_GPU_STANDIN=1, the actors on their CPU path")
    parser.add_argument("--variant", choices=("test", "default"), default="test", help="tiny model variant (default: test)")
    parser.add_argument("--model-dir", type=model_dir_argument, help="a model directory to use instead of building the variant")
    parser.add_argument("--steps", type=int, default=6, help="steps of the reference run (default 6)")
    parser.add_argument("--checkpoint-every", type=int, default=2, help="run.checkpoint_every (default 2)")
    parser.add_argument("--kill-after", type=int, default=3, help="SIGKILL the student learner after this step (default 3)")
    parser.add_argument("--resume-from", type=int, default=4, help="the stopped run's last step (default 4)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="which of (a) reference on the device, (b) kill, (c) resume, (d) phases to run "
                             "(default: a,b,c,d; a runs whenever another does: it is their reference)")
    parser.add_argument("--kind", help="the time plan's GPU kind (default: from the device's name)")
    parser.add_argument("--gpu-memory-gib", type=float,
                        help="plan for this many GiB per GPU instead of the device's (resources.gpu_memory_gib)")
    parser.add_argument("--work-dir", type=Path, help="where the run directories and the actors' logs go (default: a "
                                                      "temporary directory, removed unless the part failed)")
    parser.add_argument("overrides", nargs="*", metavar="dotted.key=value", help="more config overrides (every run)")
    args = parser.parse_args(argv)
    args.parts = sorted(set(args.parts.replace(" ", "").split(",")) | {"a"})
    if not set(args.parts) <= set(PARTS):
        parser.error(f"--parts: choose among {','.join(PARTS)}")
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the engine's versions are compared between steps)")
    if "b" in args.parts and not 1 <= args.kill_after < args.steps:
        parser.error("--kill-after must be a step before the last")
    if "c" in args.parts and not (1 <= args.resume_from < args.steps and args.resume_from % args.checkpoint_every == 0):
        parser.error("--resume-from must be a checkpoint step (a multiple of --checkpoint-every) before the last")
    return args


def emit(result: dict[str, Any], code: int) -> int:
    print(json.dumps(result), flush=True)
    return code


def print_phases(phases: dict[str, Any]) -> None:
    """(d) on stderr: measured beside planned seconds per phase, and what the plan misses."""
    say = lambda line: print(f"[gpu_system] {line}", file=sys.stderr, flush=True)  # noqa: E731
    if not phases.get("phases"):
        say(f"phases: not planned: {phases.get('problem')}")
        return
    say(f"seconds per step, mean of the reference's steps after the first; planned for {phases['planned_for']}:")
    say(f"  {'phase':<11}{'measured':>10}{'planned':>10}")
    for name, t in phases["phases"].items():
        cell = lambda v: f"{v:10.3f}" if v is not None else f"{'-':>10}"  # noqa: E731
        say(f"  {name:<11}{cell(t['measured_s'])}{cell(t['planned_s'])}")
    say(f"  {'step':<11}{phases['step_s']['measured']:10.3f}{phases['step_s']['planned']:10.3f}")
    for name, why in phases["plan_misses"].items():
        say(f"  the plan misses {name}: {why}")


def prepare(args: argparse.Namespace, result: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """Everything before Ray starts: dependencies, the device, the model, the plan, the sandbox. Returns an exit code
    where the part cannot run (``result`` then says why), else None and what the runs need."""
    missing = missing_for_system()
    if missing:
        line = missing_line(missing)
        print(f"gpu_system: {line}", file=sys.stderr)
        result.update({"reason": line, "missing": missing})
        return 3, {}
    import torch

    if args.standin:
        from actors.cluster import GPU_STANDIN_ENV

        os.environ[GPU_STANDIN_ENV] = "1"  # before Ray starts: its workers inherit it
        name, memory, expected = "stand-in logical GPU (Ray's, on the CPU)", None, "cpu"
        why = "stand-in mode: Ray gives the actors a logical GPU, actors.cluster.actor_device keeps them on the CPU"
    elif not torch.cuda.is_available():
        line = "no CUDA device (torch.cuda.is_available() is False); --standin runs the part on the CPU"
        print(f"gpu_system: {line}", file=sys.stderr)
        result["reason"] = line
        return 3, {}
    else:
        props = torch.cuda.get_device_properties(0)
        name, memory, expected = props.name, int(props.total_memory), "cuda"
        why = "Ray gives each GPU actor the GPU; actors.cluster.actor_device picks CUDA"
    kind = args.kind or ("cpu" if args.standin else gpu_kind(name))
    kind = kind if kind in DEVICE_KINDS else None  # a GPU the time plan has no constants for
    result["device"] = {"name": name, "memory_gib": round(memory / 2**30, 2) if memory else None, "kind": kind,
                        "expected_tensor_device": expected, "why": why, "torch": torch.__version__}
    os.environ.update(DETERMINISM_ENV)  # for Ray's workers (learners, engine); see actors.cluster.deterministic_torch
    result["determinism"] = {"env": dict(DETERMINISM_ENV),
                             "torch": "use_deterministic_algorithms(True, warn_only=True) in every learner and engine"}

    started = time.perf_counter()
    if args.model_dir is not None:
        model_path, cached = str(args.model_dir.resolve()), True
    else:
        from tinycoder import ensure_model, model_dir
        from tinycoder.cache import MANIFEST

        cached = (model_dir(args.variant, 0) / MANIFEST).is_file()
        model_path = str(ensure_model(args.variant, progress=False))
    result["model"] = {"variant": None if args.model_dir else args.variant, "path": model_path, "cached": cached,
                       "build_s": None if cached else round(time.perf_counter() - started, 1)}

    from configs import load_config
    from planning.placement import ClusterView

    overrides = [f"model.path={model_path}", *LAYOUT, f"run.checkpoint_every={args.checkpoint_every}",
                 *([f"resources.gpu_memory_gib={args.gpu_memory_gib}"] if args.gpu_memory_gib else []), *args.overrides]
    cpus = float(os.cpu_count() or 1)
    view = ClusterView({"CPU": cpus, "GPU": 1.0}, [{"CPU": cpus, "GPU": 1.0}], f"this machine ({name})",
                       gpu_memory_bytes=memory)
    config = load_config(None, overrides + [f"run.steps={args.steps}"])
    run_plan, resolved = plan_and_resolve(config, view)
    result["config"] = overrides
    if resolved is None:  # refused before any actor starts, as launch.py refuses
        verdict = run_plan.memory.verdict() if run_plan.memory else run_plan.memory_problem
        capacity = (f"{args.gpu_memory_gib:g} GiB, --gpu-memory-gib" if args.gpu_memory_gib
                    else f"{memory / 2**30:.1f} GiB" if memory else "80 GiB, the plan's default")
        line = f"the layout does not fit {name} ({capacity}): {verdict}"
        print(f"gpu_system: {line}", file=sys.stderr)
        result.update({"status": "failed", "reason": line, "memory_plan": {"fits": False, "verdict": verdict}})
        return 2, {}
    result["memory_plan"] = {"fits": True, "verdict": run_plan.memory.verdict()}

    from verifier.defences import missing as missing_defences
    from verifier.sandbox import Verifier

    with Verifier() as verifier:
        absent = missing_defences(verifier.defences(), config.verifier.require)
    if absent:
        overrides.append("verifier.allow_weak_sandbox=true")
        result["sandbox"] = {"missing": absent, "verifiers": f"ran with verifier.allow_weak_sandbox=true (development "
                             f"only): this machine lacks {', '.join(absent)} of verifier.require"}
    else:
        result["sandbox"] = {"missing": [],
                             "verifiers": f"ran in the full sandbox ({', '.join(config.verifier.require)})"}
    print(f"[gpu_system] verifiers {result['sandbox']['verifiers']}", file=sys.stderr, flush=True)
    return None, {"config": config, "overrides": overrides, "view": view, "expected": expected, "kind": kind,
                  "cpus": cpus}


def run_parts(args: argparse.Namespace, result: dict[str, Any], config: Any, overrides: list[str], view: Any,
              expected: str, kind: str | None, cpus: float, work: Path) -> dict[str, bool]:
    """(a)-(d) on a local Ray cluster of one GPU started here; the checks, by name."""
    import ray

    import launch
    from actors.cluster import NAMESPACE
    from configs import load_config
    from planning.placement import plan_placement
    from reporting.run_dir import LOG_DIR_ENV, RunDirectory

    logs = work / "logs"
    os.environ[LOG_DIR_ENV] = str(logs)  # every actor of every run logs to logs/<actor>.log (appended)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    placement = plan_placement(config)
    names = [a.name for a in placement.actors if a.role in ("inference", "learner-teacher", "learner-student")]
    learners = [a.name for a in placement.actors if a.role.startswith("learner")]
    student = next(a.name for a in placement.actors if a.role == "learner-student")
    steps = list(range(1, args.steps + 1))

    def cfg(run: str, n: int) -> Any:
        return load_config(None, overrides + [f"run.steps={n}", f"run.run_dir={work / run}"])

    checks: dict[str, bool] = {}
    ray.init(address="local", num_cpus=int(max(cpus, placement.totals()["CPU"]) + 0.999), num_gpus=1,
             namespace=NAMESPACE, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        reference, watch = watched_run(cfg("reference", args.steps), view, names)
        result.update({"reference": reference, "devices": watch.devices,
                       "one_base": one_base(watch.devices, learners, expected == "cuda"),
                       "handover": handed_over(watch.versions, config.population.adapters)})
        ok_devices, problems = on_device(watch.devices, expected)
        checks.update({"reference_ran": reference["exit_code"] == 0 and reference["steps"] == steps,
                       "one_base": result["one_base"].get("passed", False), "handover": result["handover"]["passed"]})
        errors = list(watch.errors)
        if "b" in args.parts:
            killed, kwatch = watched_run(cfg("killed", args.steps), view, names, kill=(args.kill_after, student),
                                         watch=False)
            result["kill"] = {**killed, "actor": student, "after_step": args.kill_after, "killed_pids": kwatch.killed,
                              "devices_after_recovery": kwatch.devices_after_recovery}
            ok_after, problems_after = on_device(kwatch.devices_after_recovery, expected)
            ok_devices, problems = ok_devices and ok_after, problems + [f"after the recovery: {p}" for p in problems_after]
            recoveries = killed["recoveries"]
            checks["kill_recovered"] = (killed["exit_code"] == 0 and len(kwatch.killed) == 1 and len(recoveries) == 1
                                        and recoveries[0]["actors"] == [student] and killed["steps"] == steps)
            errors += kwatch.errors
        if "c" in args.parts:
            stopped, _ = watched_run(cfg("stopped", args.resume_from), view, names, watch=False)
            further = args.steps - args.resume_from
            resumed_config = launch.resolve_config(launch.parse_args(  # what `launch.py --resume DIR --steps N` runs
                ["--resume", str(work / "stopped"), "--steps", str(further)]))
            resumed, _ = watched_run(resumed_config, view, names, watch=False, resume=True, further_steps=further)
            result["resume"] = {"stopped": stopped, "resumed": resumed, "from_step": args.resume_from}
            checks["resume_ran"] = stopped["exit_code"] == 0 and resumed["exit_code"] == 0 and resumed["steps"] == steps
        checks["on_device"] = ok_devices
        result.update({"device_problems": problems, "watch_errors": errors})
    finally:
        ray.shutdown()
    ops = nondeterministic_ops(logs)
    result["determinism"]["nondeterministic_ops"] = ops
    reference_state = comparable_state(work / "reference", args.steps) if checks["reference_ran"] else None
    for part, key, run in (("b", "kill", "killed"), ("c", "resume", "stopped")):
        if part in args.parts:
            done = (checks["kill_recovered"] if part == "b" else checks["resume_ran"]) and reference_state is not None
            result[key]["compare"] = (compare(reference_state, comparable_state(work / run, args.steps), bool(ops)) if done
                                      else {"equal": None, "passed": False, "reason": "a run did not finish"})
            checks[f"{key}_equal"] = result[key]["compare"]["passed"]
    if "d" in args.parts and checks["reference_ran"]:
        ref = RunDirectory(work / "reference")
        result["phases"] = phase_table(config, overrides, view, ref.read_metrics(), ref.read_events(), kind, args.standin)
        print_phases(result["phases"])
    return checks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    result: dict[str, Any] = {"mode": "standin" if args.standin else "cuda", "parts": args.parts, "status": "not_run",
                              "passed": False}
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gpu-system-"))
    try:
        code, ready = prepare(args, result)
        if code is None:
            work.mkdir(parents=True, exist_ok=True)
            checks = run_parts(args, result, work=work, **ready)
            result.update({"checks": checks, "status": "ok", "passed": all(checks.values())})
            code = 0 if result["passed"] else 1
    except Exception as exc:  # noqa: BLE001  (what ran so far is still reported)
        import traceback

        result.update({"status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc()[-3000:]})
        print(f"gpu_system: {result['reason']}", file=sys.stderr)
        code = 1
    result["seconds"] = round(time.perf_counter() - began, 1)
    if args.work_dir is None and (result["passed"] or not any(work.iterdir())):
        shutil.rmtree(work, ignore_errors=True)
    else:  # the run directories and the actors' logs (logs/<actor>.log) of a failed part are kept
        result["work_dir"] = str(work)
    return emit(result, code)


if __name__ == "__main__":
    sys.exit(main())
