"""Time every LoRA evolution operator on a rank-64 adapter with Qwen2.5-7B shapes, beside the dense route.

The adapter: 28 layers x 7 modules (q/o 3584x3584, k/v 512x3584, gate/up 18944x3584, down 3584x18944, as
d_out x d_in), rank 64, float32 factors (adapters train in float32 here; 646 MB per adapter, three alive at
a time). A ~ U(-1/sqrt(d_in), 1/sqrt(d_in)) as PEFT initialises it, B ~ N(0, 0.02^2) as after some training.

Routes compared in the same run:
- each operator on the whole adapter (median of ``--repeats`` children),
- the thin SVD alone (``factored_svd`` of every slot: Gram roots + r x r SVD),
- the dense route on one slot of each shape (form Delta W, full SVD, cut to rank r, rebuild factors),
  extrapolated to all 196 slots,
- float64 Householder QR of both factors + core SVD on the same slots, extrapolated likewise.

Progress goes to stderr; the last stdout line is one JSON object with ``median_s`` (operator -> seconds per
child), ``ratio_to_perturb`` (each operator's time over perturb_singular_values' in the same run, so a number
from a loaded machine can still be judged), the load (``os.getloadavg`` before and after, ``uptime``) and
``dense_svd_ratio`` (extrapolated dense time / measured perturb_singular_values time).
Run: ``nice -n 10 python -m bench.operators`` (about 4-8 minutes on two cores; ``--quick`` for a 4-layer smoke
run; ``--device cuda`` puts the adapters and the generator on the GPU and synchronises around every timing).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch


from bench import qwen25_7b
from planning.memory_plan import ModelDims

from configs.operators import SPECS
from evolution.replacement import apply_operator
from evolution.adapter_slots import find_slots
from evolution.heap import reuse_freed_blocks
from evolution.thin_svd import factored_svd, factored_svds, householder_svd

RANK = 64
QWEN25_7B = {  # module -> (d_out, d_in), from the model's public config.json (bench/qwen25_7b.py)
    f"{'self_attn' if name.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')) else 'mlp'}.{name}": (d_out, d_in)
    for name, (d_in, d_out) in ModelDims.from_config_json(qwen25_7b.CONFIG).module_widths().items()
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def random_adapter(layers: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    adapter = {}
    for layer in range(layers):
        for module, (d_out, d_in) in QWEN25_7B.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            bound = d_in**-0.5
            adapter[f"{prefix}.lora_A.weight"] = torch.empty(RANK, d_in).uniform_(-bound, bound, generator=gen)
            adapter[f"{prefix}.lora_B.weight"] = torch.empty(d_out, RANK).normal_(0.0, 0.02, generator=gen)
    return adapter


SYNC = lambda: None  # noqa: E731  (torch.cuda.synchronize under --device cuda)


def timed(fn, repeats: int, warmup: bool = True) -> tuple[float, object, float]:
    """Median wall and process-CPU seconds of ``repeats`` calls, after one untimed warm-up call.

    CPU time (all threads of this process) is reported beside wall time because the machines this runs on
    are shared: with one thread, wall time on a dedicated core would be close to the CPU time.
    """
    if warmup:
        fn()
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        result = None
        gc.collect()
        SYNC()
        cpu, start = time.process_time(), time.perf_counter()
        result = fn()
        SYNC()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), result, statistics.median(cpus)


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def dense_route(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What a dense implementation does: form Delta W, full SVD, keep r components, rebuild balanced factors."""
    delta = b @ a
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    root = s[:RANK].sqrt()
    return root[:, None] * vh[:RANK], u[:, :RANK] * root[None, :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="2,1",
                        help="torch intra-op thread counts to time the operators with; the first one is median_s")
    parser.add_argument("--quick", action="store_true", help="4 layers, 1 repeat, no dense SVD of the MLP slots")
    parser.add_argument("--operators", default="", help="comma-separated operators to time (default: all); "
                        "perturb_singular_values is always timed, as the reference of ratio_to_perturb")
    parser.add_argument("--no-dense", action="store_true",
                        help="skip the dense and Householder routes (minutes on a loaded CPU); time the operators only")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the adapters and the generator live")
    args = parser.parse_args()
    global SYNC
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device")
        SYNC = torch.cuda.synchronize
    if args.quick:
        args.layers, args.repeats = 4, 1
    threads = [int(t) for t in args.threads.split(",")]
    torch.manual_seed(0)
    heap_reuse = reuse_freed_blocks()  # as the league actor does
    load_before = load_average()
    log(f"torch {torch.__version__}; threads {threads}; load average {load_before}; "
        f"building two rank-{RANK} adapters, {args.layers} layers")
    parent_a = {k: v.to(device) for k, v in random_adapter(args.layers, 1).items()}
    parent_b = {k: v.to(device) for k, v in random_adapter(args.layers, 2).items()}
    slots = find_slots(parent_a)
    factor_bytes = sum(t.numel() * t.element_size() for t in parent_a.values())
    log(f"{len(slots)} slots, {factor_bytes / 2**20:.0f} MiB of float32 factors per adapter")

    # every operator of the spec table at its default strength, as the replacement policy applies it
    calls = {name: (lambda g, name=name, spec=spec: apply_operator(
                 name, spec.strength, [parent_a, parent_b] if spec.kind == "crossover" else [parent_a], g))
             for name, spec in SPECS.items()}
    if args.operators:
        wanted = {"perturb_singular_values", *args.operators.split(",")}
        unknown = sorted(wanted - set(calls))
        if unknown:
            parser.error(f"unknown operators {unknown}")
        calls = {k: v for k, v in calls.items() if k in wanted}
    by_threads: dict[int, dict[str, float]] = {}
    cpu_by_threads: dict[int, dict[str, float]] = {}
    changes = {}
    for n in threads:
        torch.set_num_threads(n)
        by_threads[n], cpu_by_threads[n] = {}, {}
        for name, call in calls.items():
            gen = torch.Generator(device=device).manual_seed(0)
            seconds, child, cpu = timed(lambda: call(gen), args.repeats)
            by_threads[n][name], cpu_by_threads[n][name] = seconds, cpu
            changes[name] = child.summary()
            log(f"[{n} thread(s)] {name:>24}: {seconds:.3f} s per child ({cpu:.3f} s CPU), "
                f"max relative change {child.max_relative_change:.3f}")
            del child
    primary = threads[0]
    torch.set_num_threads(primary)
    median_s = by_threads[primary]

    def all_thin_svds() -> None:
        factored_svds([([parent_a[s.b_key]], [parent_a[s.a_key].mT], None) for s in slots])

    thin_s, _, _ = timed(all_thin_svds, args.repeats)
    log(f"[{primary} thread(s)] thin SVD of every slot: {thin_s:.3f} s")

    # one slot per shape, then extrapolate by how many slots of each shape the adapter has
    per_module_dense, per_module_qr, per_module_thin = {}, {}, {}
    done: dict[tuple[int, int], str] = {}
    for module, shape in QWEN25_7B.items():
        if args.no_dense:
            break
        if shape in done or (shape[::-1] in done and module == "mlp.down_proj"):
            # same shape, or the transposed MLP shape (a dense SVD of M^T costs what one of M does)
            same = done.get(shape) or done[shape[::-1]]
            per_module_dense[module], per_module_qr[module], per_module_thin[module] = (
                per_module_dense[same], per_module_qr[same], per_module_thin[same])
            continue
        done[shape] = module
        key = f"base_model.model.model.layers.0.{module}"
        a, b = parent_a[f"{key}.lora_A.weight"], parent_a[f"{key}.lora_B.weight"]
        per_module_thin[module] = timed(lambda: factored_svd([b], [a.mT]), 5)[0]
        per_module_qr[module] = timed(lambda: householder_svd(a, b), 1, warmup=False)[0]
        if args.quick and max(shape) > 4096:
            per_module_dense[module] = float("nan")
        else:
            per_module_dense[module] = timed(lambda: dense_route(a, b), 1, warmup=False)[0]
        log(f"{module:>24}: dense {per_module_dense[module]:.2f} s, householder {per_module_qr[module]:.3f} s, "
            f"thin {per_module_thin[module] * 1e3:.1f} ms (one slot)")
    dense_total = args.layers * sum(per_module_dense.values()) if per_module_dense else float("nan")
    qr_total = args.layers * sum(per_module_qr.values()) if per_module_qr else float("nan")
    result = {
        "adapter": {"layers": args.layers, "modules": list(QWEN25_7B), "rank": RANK, "dtype": "float32",
                    "mib_per_adapter": round(factor_bytes / 2**20, 1), "slots": len(slots)},
        "threads": primary,
        "heap_reuse": heap_reuse,
        "repeats": args.repeats,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "load_average_before_after": [load_before, load_average()],
        "uptime_after": uptime(),
        "median_s": {k: round(v, 4) for k, v in median_s.items()},
        "ratio_to_perturb": {k: round(v / median_s["perturb_singular_values"], 2) for k, v in median_s.items()},
        "median_s_by_threads": {str(n): {k: round(v, 4) for k, v in m.items()} for n, m in by_threads.items()},
        "median_cpu_s_by_threads": {str(n): {k: round(v, 4) for k, v in m.items()} for n, m in cpu_by_threads.items()},
        "goal_s": 1.0,
        "within_goal": {k: v <= 1.0 for k, v in median_s.items()},
        "thin_svd_all_slots_s": round(thin_s, 4),
        "dense_route_extrapolated_s": round(dense_total, 2),
        "householder_qr_route_extrapolated_s": round(qr_total, 3),
        "dense_svd_ratio": round(dense_total / median_s["perturb_singular_values"], 1),
        "dense_over_thin_svd": round(dense_total / thin_s, 1),
        "householder_over_thin_svd": round(qr_total / thin_s, 2),
        "dense_per_slot_s": {k: round(v, 3) for k, v in per_module_dense.items()},
        "householder_per_slot_s": {k: round(v, 4) for k, v in per_module_qr.items()},
        "thin_per_slot_ms": {k: round(v * 1e3, 2) for k, v in per_module_thin.items()},
        "children": changes,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
