#!/usr/bin/env python
"""Launch a PopuLoRA run: validate the config, plan placement, start (or attach to) Ray, train.

    python launch.py                                  # the embedded default: configs/tiny.yaml on CPU
    python launch.py --config configs/qwen2.5-7b-4t4s.yaml model.path=/models/Qwen2.5-7B
    python launch.py --dry-run population.teachers=4  # validate + print config, placement and memory plan, start nothing
    python launch.py --resume runs/2026-11-21T10-00-00 --steps 10
    python launch.py --quiet                          # errors and the final summary only

Overrides are ``dotted.key=value`` with YAML values. Under ``ray job submit`` (or with RAY_ADDRESS
set) the run attaches to that cluster; else to the cluster ``ray start`` runs on this machine, if any
(``RAY_ADDRESS=local`` starts a separate one instead); otherwise it starts a local one and prints its
dashboard address and how to log in. The dry run checks the plan against the same cluster. The actors'
output goes to RUN_DIR/logs/ (``--verbose``: to the terminal).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from configs import Config, ConfigError, dump_config, load_config
from planning.memory_plan import HostView, with_resolved_checkpointing
from planning.placement import ClusterView
from planning.run_plan import RunPlan, plan_run
from planning.lengths import Lengths, RunRecordError, lengths_from_run
from planning.time_plan import measured_phase_seconds
from reporting.run_dir import RunDirectory, RunDirectoryError, config_run_dir, fresh_run_refusal, resolve_run_dir
from reporting.tracking import check_tracking


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="launch.py",
        description="Population-based asymmetric self-play (PopuLoRA) on Ray.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Overrides: dotted.key=value (YAML values), e.g. population.teachers=4 inference.backend=hf\n"
               "Output: one line per step and a summary; the actors' output and the driver's log go to RUN_DIR/logs/.\n"
               "Dashboard: a local run prints its address; log in with the token `ray get-auth-token` prints.",
    )
    parser.add_argument("--config", type=Path, help="YAML preset (default: configs/tiny.yaml)")
    parser.add_argument("--run-dir", type=Path, help="output directory of a new run (default: run.root/<name>-<timestamp>; "
                                                     "run.root: runs/ here, ~/populora-runs under `ray job submit`); "
                                                     "a directory that holds a run is refused")
    parser.add_argument("--resume", type=Path, metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    parser.add_argument("--steps", type=int, help="steps to run (with --resume: further steps; without, --resume runs to "
                                                  "the run's planned last step)")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate, print the config, placement, memory plan and time plan, exit (1 if memory does not fit)")
    parser.add_argument("--cluster", metavar="[NODESx]GPUSxKIND",
                        help="with --dry-run: plan time for this cluster (e.g. 8xH100, 2x8xA100), present or not")
    parser.add_argument("--all", action="store_true", dest="all_candidates",
                        help="with --dry-run: list every way to run the described cluster (default: the fastest few)")
    parser.add_argument("--from-run", type=Path, metavar="RUN_DIR",
                        help="with --dry-run: plan time with the lengths RUN_DIR recorded, beside its measured phases")
    parser.add_argument("--constants", type=Path, metavar="FILE",
                        help="plan time with the constants planning/calibrate.py measured on a node (plan.constants_file)")
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("--quiet", action="store_true",
                          help="print only errors and the final summary (no progress bar, step lines or dashboard lines)")
    loudness.add_argument("--verbose", action="store_true",
                          help="forward the actors' output (model loading, engine logs) to this terminal instead of "
                               "RUN_DIR/logs/, and log at DEBUG")
    parser.add_argument("overrides", nargs="*", metavar="dotted.key=value")
    return parser.parse_args(argv)


def root_override(overrides: list[str]) -> Path | None:
    """The ``run.root=...`` among ``overrides`` (the last one), else None."""
    from configs.loading import parse_override

    roots = [value for key, value in map(parse_override, overrides) if key == ["run", "root"]]
    return Path(str(roots[-1])) if roots and roots[-1] is not None else None


def resolve_config(args: argparse.Namespace) -> Config:
    """The validated config of this invocation (a resumed run starts from its saved config), its run directory
    resolved (``reporting.run_dir.resolve_run_dir``: absolute; under ``ray job submit`` under run.root, never in
    Ray's copy of the working directory). Raises ``ConfigError`` or ``RunDirectoryError``."""
    overrides = list(args.overrides)
    if args.steps is not None and args.resume is None:  # with --resume, --steps counts further steps (actors.driver.train)
        overrides.append(f"run.steps={args.steps}")
    if args.constants is not None:
        overrides.append(f"plan.constants_file={args.constants}")
    if args.resume is not None:
        if args.config is not None:
            raise ConfigError("--resume continues a run with its saved config; drop --config (overrides still apply)")
        resume = resolve_run_dir(args.resume, "", root_override(overrides), os.environ, Path.cwd(), datetime.now())
        saved = resume / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"--resume {args.resume}: no config.yaml there (is it a run directory?)")
        return load_config(saved, overrides + [f"run.run_dir={resume}"])
    if args.run_dir is not None:
        overrides.append(f"run.run_dir={args.run_dir}")
    config = load_config(args.config, overrides)
    return config.model_copy(update={"run": config.run.model_copy(update={"run_dir": config_run_dir(config)})})


def gpu_memory_bytes() -> int | None:
    """The smallest GPU's total memory on this machine (``nvidia-smi``), or None where it cannot be read."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=False, timeout=30).stdout
        mib = [int(float(line)) for line in out.split() if line.strip()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return min(mib) * 2**20 if mib else None


def local_gpus() -> int:
    """GPUs ``nvidia-smi -L`` lists on this machine (0 without it)."""
    if not shutil.which("nvidia-smi"):
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


def local_cluster_view() -> ClusterView:
    """What a local cluster started here would offer (CPUs, visible GPUs and their memory), without starting one."""
    gpus = local_gpus()
    cpus = float(os.cpu_count() or 1)
    node = {"CPU": cpus, "GPU": float(gpus)}
    return ClusterView(total=dict(node), nodes=[node], source="this machine (no cluster running; a local one would be started)",
                       gpu_memory_bytes=gpu_memory_bytes() if gpus else None)


def cluster_view() -> ClusterView:
    """The cluster the run will use (``actors.cluster.cluster_address``: RAY_ADDRESS, else the one ``ray start`` runs
    on this machine) as it is now, else this machine (where the run would start a local cluster). Raises
    ``ClusterConnectError`` where the cluster to attach to cannot be reached."""
    import logging

    from actors.cluster import AUTH_SETUP_LOGGER, LOCAL_ASKED, attach, attached_description, cluster_address

    address, how = cluster_address()
    if not address:
        view = local_cluster_view()
        if how == LOCAL_ASKED:
            return replace(view, source=f"this machine ({LOCAL_ASKED}: a separate local cluster would be started)")
        return view
    import ray

    from actors.cluster_wait import live_view

    logging.getLogger(AUTH_SETUP_LOGGER).setLevel(logging.ERROR)  # Ray's announcement of token authentication
    attach(address, how, logging_level="ERROR", log_to_driver=False)
    try:
        view = live_view(attached_description(address, how))
        memory = None
        if view.total.get("GPU", 0):  # read nvidia-smi on a GPU node; a busy cluster just falls back
            probe = ray.remote(num_cpus=0, num_gpus=0.001)(gpu_memory_bytes).remote()
            ready, _ = ray.wait([probe], timeout=30)
            memory = ray.get(ready[0]) if ready else None
        return replace(view, gpu_memory_bytes=memory)
    finally:
        ray.shutdown()


def host_view() -> HostView:
    """This machine's RAM and the size of /dev/shm or ``$POPULORA_SHM_DIR`` (where the learners' shared base goes);
    whether it has GPUs (then its RAM is the GPU node's, which holds the sleeping engines' weights of a colocated
    layout)."""
    from learners.shared_base_paths import default_shm_dir

    shm = default_shm_dir()
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    on_shm = shm != Path(tempfile.gettempdir())  # the temp dir is default_shm_dir's fall-back: disk, sized as RAM
    return HostView(ram_bytes=ram, shm_bytes=shutil.disk_usage(shm).total if on_shm else ram,
                    shm_path=str(shm) if on_shm else "temp dir", gpu_node=local_gpus() > 0)


def plan(config: Config, cluster: str | None = None, lengths: Lengths | None = None) -> RunPlan:
    """The whole plan of ``config`` (``planning.run_plan``), asked for once, on the cluster the run will use
    (``cluster_view``) and this machine's memory; time on the described cluster (``--cluster``, else the config's)."""
    return plan_run(config, cluster_view(), host_view(), cluster, lengths)


def run_records(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """The step rows and the events of RUN_DIR/metrics.jsonl (``--from-run``); a clear error when there are none."""
    if not (run_dir / "metrics.jsonl").is_file():
        raise ConfigError(f"--from-run {run_dir}: no metrics.jsonl there (is it a run directory?)")
    run = RunDirectory(run_dir)
    return run.read_metrics(), run.read_events()


def dry_run(config: Config, cluster: str | None = None, from_run: Path | None = None, show_all: bool = False) -> int:
    print("# resolved configuration")
    print(dump_config(config))
    rows, events, lengths = [], [], None
    if from_run is not None:
        try:
            rows, events = run_records(from_run)
            lengths = lengths_from_run(rows[1:] or rows, str(from_run))
        except (ConfigError, RunRecordError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    run_plan = plan(config, cluster, lengths)
    print("# placement plan")
    print(run_plan.placement.render())
    print(f"\n# resources of {run_plan.view.source}")
    for line in run_plan.resource_lines:
        print(f"  {line}")
    if config.model.path.startswith("${"):
        print(f"\nnote: model.path is {config.model.path}: set that variable or override model.path=/path/to/model")
    memory = run_plan.memory
    if memory is None:  # the model's config.json cannot be read: the run would stop here too
        print("\nmemory: not planned\ntime: not planned", flush=True)
        print(f"error: {run_plan.memory_problem}", file=sys.stderr)
        return 2
    print(f"\ndry run: configuration valid; the plan {'fits' if run_plan.resources_fit else 'does NOT fit'} the resources above\n")
    print(memory.render())
    print(memory.verdict())
    timed = print_time(run_plan, rows, events, show_all)
    return timed if memory.fits else 1


def print_time(run_plan: RunPlan, rows: list[dict], events: list[dict], show_all: bool = False) -> int:
    """The time plan and the ranking of the ways to run the cluster (``show_all``: every one), a run's measured phases
    beside it (``--from-run``), and the closing ``time:`` line; 1 when the configured layout cannot be the described
    cluster's."""
    choice = run_plan.time
    if choice is None:
        print(f"\ntime: not planned: {run_plan.time_problem}")
        return 2 if run_plan.time_input_error else 0
    print()
    for line in run_plan.constants_lines:
        print(line)
    print(choice.render(show_all))
    if rows:
        measured = measured_phase_seconds(rows[1:] or rows, events)
        print(f"# measured in the run (mean of {len(rows[1:] or rows)} steps): "
              + ", ".join(f"{k} {v:.2f} s" for k, v in measured.items()))
    if run_plan.time_problem:
        print(f"time: does not fit: {run_plan.time_problem}")
        return 1
    print(choice.verdict())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = resolve_config(args)
    except (ConfigError, RunDirectoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    refused = None if args.resume is not None else fresh_run_refusal(config.run.run_dir)
    if refused:  # before anything starts or is written
        print(f"error: {refused}", file=sys.stderr)
        return 2
    unusable = check_tracking(config.logging.backends)
    if unusable:  # a tracker's package missing, W&B online without a key: the dry run and the run stop here
        print(f"error: {unusable}", file=sys.stderr)
        return 2
    from actors.cluster import ClusterConnectError

    try:
        return run_or_plan(args, config)
    except ClusterConnectError as exc:  # the cluster to attach to cannot be reached: no actor started
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run_or_plan(args: argparse.Namespace, config: Config) -> int:
    """``main`` past the config: the dry run, or the plan's checks and the run."""
    if args.dry_run:
        return dry_run(config, args.cluster, args.from_run, args.all_candidates)
    if args.cluster or args.from_run or args.all_candidates:
        print("error: --cluster, --from-run and --all plan without running; add --dry-run", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"run directory: {config.run.run_dir}", flush=True)
    run_plan = plan(config)
    memory = run_plan.memory
    if memory is None:
        print(f"error: {run_plan.memory_problem}", file=sys.stderr)
        return 2
    if not memory.fits:  # refuse before any actor starts
        print(memory.render(), file=sys.stderr)
        print(memory.verdict(), file=sys.stderr)
        return 1
    for warning in memory.warnings:  # runs, but slower than planned
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if not args.quiet:
        print(memory.verdict(), flush=True)
    short = run_plan.missing_resources()
    if short:  # refuse before any actor starts, instead of actors that wait forever for resources
        print(f"error: {run_plan.view.source} lacks resources the placement plan needs:", file=sys.stderr)
        for line in short:
            print(f"  {line}", file=sys.stderr)
        print("lower resources.* (inference_gpus, learner_gpus, ...) or run on a larger cluster; "
              "python launch.py --dry-run shows the plan", file=sys.stderr)
        return 1
    config = with_resolved_checkpointing(config, memory)
    try:
        from actors.driver import train
    except ImportError as exc:  # the only placeholder: the loop lands with the system issue
        print(f"error: the training loop is not built yet ({exc}); use --dry-run", file=sys.stderr)
        return 3
    output = "quiet" if args.quiet else "verbose" if args.verbose else "default"
    return train(config, resume=args.resume is not None, output=output,
                 further_steps=args.steps if args.resume is not None else None)


if __name__ == "__main__":
    sys.exit(main())
