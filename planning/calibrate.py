"""Calibrate the time plan on this node: measure its constants at the config's model, engine and shapes, write them.

    python -m planning.calibrate --out node.yaml [--config configs/qwen2.5-7b-4t4s.yaml] [dotted.key=value ...]
    python launch.py --dry-run --constants node.yaml [--config ...]      # plan with them

On the machine it runs on (its first GPU, else its CPU as the ``cpu`` kind), with the config's model
(``model.path``; ``tiny`` is the built-in model, ``model.tiny_variant``), dtype, LoRA and engine
(``inference.backend``: vLLM where it is installed and asked for, the transformers engine otherwise; ``--engine``
overrides), each measurement with the functions of ``planning/measurements.py`` (one implementation of each):

- training (``<kind>.train_mfu``): one learner step of the config's LoRA (the members of one role) over
  ``--train-seqs`` sequences of about ``--train-prompt`` + ``--train-completion`` tokens, activation checkpointing
  as the learners resolve it; MFU = tokens x F / seconds / peak, F and the FLOP conventions of the time plan;
- generation (``<kind>.decode_mfu``, ``prefill_mfu``, ``memory_bandwidth``, ``lora_decode_overhead``) on the
  engine with all the config's adapters loaded: one row, ``--rows`` rows spread over every adapter and ``--rows``
  rows on one adapter, decoding up to ``--new`` tokens (the step's fixed cost as a bandwidth; the cost of each
  added row-token on one adapter as ``decode_mfu``; all adapters against one as the LoRA overhead), and ``--rows``
  fresh prompts of ``--prompt`` tokens for prefill;
- the adapter hand-over (``host.adapter_load_bandwidth``; ``host.adapter_swap_s`` written 0, its fixed cost being
  inside): a proxy of the real path (``bench/adapter_transport.py`` runs that through Ray): one adapter exported
  in the serving dtype, written to RAM-backed storage and loaded in place into the engine, bytes / seconds;
- the verifier (``host.verifier_tasks_per_core_s``): ``--verifier-tasks`` tasks of ``bench/sandbox.py``, each run
  twice, on one worker per core of this process;
- checkpoint writes (``host.checkpoint_bandwidth``: AdamW state of every member, at most 512 MiB, fsynced into
  ``--scratch``), the league's match + record (``host.league_s``) and one evolution child of one layer of the
  config's LoRA, the median operator (``host.evolution_s_floor``; the per-parameter cost stays the committed one).

The peak of a kind with a datasheet figure in ``planning/time_constants.py`` is kept and the MFUs are measured
over it; a kind without one (and the CPU) gets the measured training FLOP/s as its effective peak (``train_mfu``
1) and, for a GPU, its memory. The file (``planning/constants_file.py``) holds the constants under their
``plan.constants`` keys, their provenance (device, kind, engine, torch/transformers/vllm versions, the model's
path and digest, the date, this command) and the raw measurements. About a minute on a CPU, a few on a GPU
(loading the model twice: learner, engine). The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from configs import ConfigError, load_config
from planning.constants_file import (
    NodeConstants, installed_versions, model_digest, read_constants_file, write_constants_file,
)
from planning.memory_plan import DTYPE_BYTES, load_model_dims
from planning.time_constants import DEVICE_KINDS, HOST

ROOT = Path(__file__).resolve().parents[1]

CHECKPOINT_MAX_BYTES = 2**29


def log(message: str) -> None:
    print(f"[calibrate] {message}", file=sys.stderr, flush=True)


def gpu_kind(name: str) -> str:
    """The plan's kind of a CUDA device name: ``NVIDIA H100 80GB HBM3`` -> ``H100``, ``NVIDIA A100-SXM4-80GB`` ->
    ``A100`` (the first word like a letter and 2-3 digits), else the name without spaces."""
    match = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", name)
    return match.group(1) if match else re.sub(r"\W+", "_", name).strip("_")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def defaults(args: argparse.Namespace, config, on_gpu: bool) -> None:
    """Fill the options not given: the config's shapes and batch on a GPU, the tiny default's on a CPU."""
    plan, tasks, pop = config.plan, config.tasks, config.population
    max_len = config.model.max_seq_len
    if args.rows is None:
        teachers = 1 if pop.single_agent else pop.teachers
        replicas = max(1, config.resources.inference_gpus // config.resources.tensor_parallel_size)
        rollouts = teachers * tasks.tasks_per_teacher * plan.valid_fraction * tasks.rollouts_k / replicas
        args.rows = max(2, min(256, math.ceil(rollouts))) if on_gpu else 24
    if args.new is None:
        args.new = min(config.inference.max_tokens, 256 if on_gpu else 48)
    if args.prompt is None:
        args.prompt = min(plan.solve_prompt_tokens, max_len - args.new - 8) if on_gpu else 300
    if args.train_seqs is None:
        args.train_seqs = 16 if on_gpu else 40
    if args.train_prompt is None:
        args.train_prompt = min(plan.solve_prompt_tokens, max_len // 2) if on_gpu else 90
    if args.train_completion is None:
        args.train_completion = min(plan.answer_tokens, max_len - args.train_prompt) if on_gpu else 35


def calibrate(args: argparse.Namespace) -> dict:
    """Measure (module docstring) and write ``args.out``; the JSON summary."""
    import torch

    from planning.measurements import (adapter_files, device_constants, host_constants, measure_generation,
                                       measure_handover, measure_host, measure_training, write_files)
    from planning.model_files import resolve_model
    from planning.verifier_workload import make_tasks, timed_execute
    from inference import make_engine
    from inference.adapter_store import ram_backed_root
    from learners.policy_learner import resolve_activation_checkpointing
    from verifier.sandbox import Verifier

    config = load_config(args.config, args.overrides)
    dims = load_model_dims(config)
    on_gpu = args.device != "cpu" and torch.cuda.is_available()
    if args.device == "cuda" and not on_gpu:
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    device = "cuda" if on_gpu else "cpu"
    defaults(args, config, on_gpu)
    if on_gpu:
        torch.cuda.set_device(0)
        name = torch.cuda.get_device_name(0)
        kind = args.kind or gpu_kind(name)
    else:
        kind = "cpu"
        threads = int(os.environ.get("POPULORA_LEARNER_THREADS", "1"))
        torch.set_num_threads(threads)  # as one learner / engine actor runs (actors/*_actor.py)
        name = f"{cpu_name()} ({threads} torch thread(s) per actor)"
    model_dir = Path(resolve_model(config, progress=False))  # the run's own resolution of model.path
    log(f"{name} as kind {kind}; model {model_dir}; {config.model.dtype}")
    measurements: dict = {}
    scratch_root = args.scratch or Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="populora-calibrate-", dir=ram_backed_root()) as ram:
        log(f"training: {args.train_seqs} sequences of ~{args.train_prompt}+{args.train_completion} tokens")
        slots = max(1, config.population.teachers, config.population.students)
        measurements["train"] = train = measure_training(
            model_dir, config, dims, args.train_seqs, args.train_prompt, args.train_completion, args.repeats, device,
            slots, resolve_activation_checkpointing(config.rl.activation_checkpointing, device))
        backend = args.engine or config.inference.backend
        members = config.population.adapters
        engine = make_engine(backend, model_dir, max_adapters=members, max_lora_rank=config.lora.rank,
                             dtype=config.model.dtype,
                             engine_args=(config.inference.vllm_engine_args or None) if backend != "hf" else None,
                             max_model_len=config.model.max_seq_len, seed=0,
                             target_modules=tuple(config.lora.target_modules), device=device)
        try:
            names = [f"a{i}" for i in range(members)]
            for i, adapter in enumerate(names):
                files = adapter_files(config, dims, getattr(torch, config.model.dtype), seed=1000 + i)
                engine.load_adapter(adapter, write_files(files, Path(ram) / f"{adapter}-v0"), 0, move=True)
            log(f"generation ({engine.backend}, {members} adapters): {args.rows} rows x {args.new} new tokens, "
                f"prefill {args.rows} x {args.prompt}")
            measurements["generation"] = gen = measure_generation(
                engine, names, dims, args.rows, args.new, args.prompt, args.repeats, DTYPE_BYTES[config.model.dtype])
            log("adapter hand-over")
            measurements["handover"] = handover = measure_handover(engine, config, dims, Path(ram), args.repeats)
            engine_name = engine.backend
        finally:
            engine.close()
    workers = len(os.sched_getaffinity(0))
    log(f"verifier: {args.verifier_tasks} tasks on {workers} worker(s)")
    verifier = Verifier(timeout_s=config.verifier.timeout_s, workers=workers,
                        max_output_chars=config.verifier.max_output_chars)
    try:
        _, seconds = timed_execute(verifier, make_tasks(args.verifier_tasks))
    finally:
        verifier.close()
    measurements["verifier"] = {"tasks": args.verifier_tasks, "workers": workers, "seconds": seconds,
                                "tasks_per_s": args.verifier_tasks / seconds}
    log("checkpoint, league, evolution")
    measurements["host"] = host = measure_host(dims, config, args.repeats, evolution_layers=1,
                                               checkpoint_max_bytes=CHECKPOINT_MAX_BYTES, scratch=scratch_root)
    known = DEVICE_KINDS.get(kind)
    cited = known.peak_flops.value if known and known.peak_flops and not known.peak_flops.measured else None
    constants = {**device_constants(kind, train, gen, cited), **host_constants(host),
                 "host.verifier_tasks_per_core_s": args.verifier_tasks / seconds / workers,
                 "host.adapter_load_bandwidth": handover["handover_bytes_per_s"], "host.adapter_swap_s": 0.0}
    if on_gpu and known is None:
        constants[f"{kind}.memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    provenance = {
        "device": name, "kind": kind, "engine": engine_name, "versions": installed_versions(),
        "model": {"path": config.model.path, "directory": str(model_dir), "digest": model_digest(dims, config.model.dtype),
                  "dtype": config.model.dtype},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "planning.calibrate", *sys.argv[1:]]),
        "cited_peak": cited is not None,
    }
    write_constants_file(args.out, constants, provenance, json.loads(json.dumps(measurements, default=float)))
    log(f"wrote {len(constants)} constants to {args.out}")
    return {"out": str(args.out), "provenance": provenance,
            "constants": {k: float(f"{v:.4g}") for k, v in constants.items()},
            "rates": {"train_tokens_per_s": round(train["train_tokens_per_s"], 1),
                      "decode_tokens_per_s_all_adapters": round(gen["decode_tokens_per_s_all_adapters"], 1),
                      "prefill_tokens_per_s": round(gen["prefill_tokens_per_s"], 1)}}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the constants file to write (YAML)")
    p.add_argument("--config", type=Path, help="YAML preset (default: configs/tiny.yaml)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: the first GPU, else the CPU")
    p.add_argument("--engine", choices=("auto", "vllm", "hf"), help="default: the config's inference.backend")
    p.add_argument("--kind", help="the device kind to file the GPU's constants under (default: from its name)")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats of each measurement (after one warm-up)")
    p.add_argument("--rows", type=int, help="decode batch (default: a step's rollouts per replica on a GPU, 24 on CPU)")
    p.add_argument("--new", type=int, help="new tokens per decoded row")
    p.add_argument("--prompt", type=int, help="tokens of each prefilled prompt")
    p.add_argument("--train-seqs", type=int, help="sequences of the learner step")
    p.add_argument("--train-prompt", type=int, help="their mean prompt tokens")
    p.add_argument("--train-completion", type=int, help="their mean completion tokens")
    p.add_argument("--verifier-tasks", type=int, default=400, help="verifier tasks (each run twice)")
    p.add_argument("--scratch", type=Path, help="where checkpoint writes go (default: the temporary directory; "
                   "give the run directory's disk)")
    p.add_argument("overrides", nargs="*", metavar="dotted.key=value", help="config overrides")
    return p


def run_calibration(out: Path, overrides: list[str], options: list[str] = (), config: Path | None = None
                    ) -> tuple[NodeConstants, dict]:
    """Run this command in a child process (its own measurements, before a bench's run) and read what it wrote."""
    command = [sys.executable, "-m", "planning.calibrate", "--out", str(out), *options,
               *(["--config", str(config)] if config else []), *overrides]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"calibration failed (exit {proc.returncode}): {shlex.join(command)}")
    return read_constants_file(out), json.loads(proc.stdout.strip().splitlines()[-1])


def plan_constants(config, node: NodeConstants, plan_kind: str = "cpu"):
    """What the dry run does with ``--constants`` (``planning.constants_file.constants_for``): the kinds, host
    constants, what was used and what ignored of ``node`` for ``config`` planned on ``plan_kind``."""
    from planning.constants_file import constants_for

    return constants_for(config, node, load_model_dims(config), plan_kind, DEVICE_KINDS, HOST)


def calibrated(out: Path, overrides: list[str], options: str | None, given: Path | None, config=None) -> tuple:
    """For the benches that check the plan on this machine: ``given`` (a file already measured) or a calibration
    run now (``options``: extra command-line options, e.g. ``"--repeats 1"``), applied to ``config``. Returns the
    kinds, the host constants and the JSON summary of the calibration."""
    node = read_constants_file(given) if given else run_calibration(out, overrides, shlex.split(options or ""))[0]
    applied = plan_constants(config, node)
    for line in applied.lines(node):
        log(line)
    return applied.kinds, applied.host, {"file": str(node.path), "provenance": node.provenance,
                                         "constants": {k: float(f"{v:.4g}") for k, v in node.constants.items()},
                                         "used": sorted(applied.used), "ignored": applied.ignored}


def main() -> None:
    args = parser().parse_args()
    try:
        summary = calibrate(args)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
