"""Benchmark: the fork-server verifier against a naive ``python -c`` per execution.

Both sides run the same AZR-style tasks twice (the determinism check) over the same number of
parallel workers and apply the same checks (the repr must be a literal no longer than the bound).
The baseline is slow, so by default it runs on a subset of the tasks and its rate is extrapolated
(the JSON says so). Progress goes to stderr; the last stdout line is one JSON object.

    nice -n 10 python -m bench.sandbox [--tasks 1000] [--baseline-tasks 150] [--workers 2]
    nice -n 10 python -m bench.sandbox --layer-costs [--tasks 400] [--rounds 3]

``--layer-costs`` measures what each operating-system layer adds to a run, side by side: the same
tasks with every layer on, then with the namespaces, Landlock, seccomp (and all three) switched off,
alternating configurations round by round. CPU per execution counts the server, the zygote and
every run (reaped at ``close``), minus the CPU of starting and stopping that configuration's
servers, measured on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor


from planning.verifier_workload import make_tasks, timed_execute
from verifier.sandbox import Status, Verifier

LAYER_CONFIGS = {
    "all_layers": (),
    "no_namespaces": ("namespaces",),
    "no_landlock": ("landlock",),
    "no_seccomp": ("seccomp",),
    "none_of_the_three": ("namespaces", "landlock", "seccomp"),
}

BASELINE_RUNNER = """
import ast, sys
{program}
value = repr(f({args}))
if len(value) > {bound}:
    print("output_too_large"); sys.exit(0)
ast.literal_eval(value)
print("ok"); print(value)
"""


def baseline_run(program: str, args: str, bound: int, timeout_s: float) -> tuple[str, str | None]:
    """One execution the naive way: a fresh interpreter per call."""
    code = BASELINE_RUNNER.format(program=program, args=args, bound=bound)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                              env={"PYTHONHASHSEED": "0", "PATH": os.environ.get("PATH", "")})
    except subprocess.TimeoutExpired:
        return "timeout", None
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or not lines:
        return "error", None
    return lines[0], (lines[1] if len(lines) > 1 else None)


def baseline_task(task: tuple[str, str], bound: int, timeout_s: float) -> tuple[str, str | None]:
    first = baseline_run(*task, bound, timeout_s)
    second = baseline_run(*task, bound, timeout_s)
    if first != second:
        return "nondeterministic", None
    return first


def cpu_used() -> float:
    """CPU seconds of this process and every reaped descendant (the server and its children)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def layer_costs(tasks: list[tuple[str, str]], workers: int, timeout_s: float, rounds: int) -> dict:
    """tasks/s and CPU per execution for each configuration of ``LAYER_CONFIGS``, alternating."""
    rates: dict[str, list[float]] = {name: [] for name in LAYER_CONFIGS}
    cpu: dict[str, list[float]] = {name: [] for name in LAYER_CONFIGS}
    executions = 2 * len(tasks)
    for round_ in range(rounds):
        for name, disable in LAYER_CONFIGS.items():
            cpu0 = cpu_used()
            Verifier(timeout_s=timeout_s, workers=workers, disable=disable).close()
            startup_cpu = cpu_used() - cpu0
            cpu0 = cpu_used()
            verifier = Verifier(timeout_s=timeout_s, workers=workers, disable=disable)
            verifier.execute_many(tasks[:20])
            start = time.perf_counter()
            results = verifier.execute_many(tasks)
            elapsed = time.perf_counter() - start
            verifier.close()
            assert all(r.status is Status.OK for r in results), name
            rates[name].append(len(tasks) / elapsed)
            cpu[name].append((cpu_used() - cpu0 - startup_cpu) / (executions + 40))
            print(f"[bench] round {round_ + 1} {name}: {rates[name][-1]:.0f} tasks/s, {1e3 * cpu[name][-1]:.3f} ms CPU/execution", file=sys.stderr)
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    full_cpu = median(cpu["all_layers"])
    return {
        "configs": {
            name: {
                "tasks_per_s_median": round(median(rates[name]), 1),
                "tasks_per_s_runs": [round(x, 1) for x in rates[name]],
                "cpu_ms_per_execution_median": round(1e3 * median(cpu[name]), 3),
                # what the switched-off layers cost each run (full minus this configuration)
                "cost_of_switched_off_layers_ms_per_execution": round(1e3 * (full_cpu - median(cpu[name])), 3),
                "speed_ratio_to_all_layers": round(median(rates[name]) / median(rates["all_layers"]), 3),
            }
            for name in LAYER_CONFIGS
        },
        "rounds": rounds,
        "tasks": len(tasks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--baseline-tasks", type=int, default=150, help="tasks the baseline runs (its rate is extrapolated)")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--layer-costs", action="store_true", help="measure the per-run cost of each OS layer instead")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --layer-costs (configurations alternate)")
    args = parser.parse_args()
    if args.layer_costs:
        tasks = make_tasks(args.tasks)
        load = os.getloadavg()
        costs = layer_costs(tasks, args.workers, args.timeout_s, args.rounds)
        print(json.dumps({"bench": "verifier_layer_costs", "workers": args.workers, "load_avg_start": [round(x, 2) for x in load],
                          "load_avg_end": [round(x, 2) for x in os.getloadavg()], **costs}))
        return

    tasks = make_tasks(args.tasks)  # made before the CPU clock starts
    bound = 10_000
    print(f"[bench] {len(tasks)} tasks, {args.workers} workers, load {os.getloadavg()}", file=sys.stderr)

    cpu0 = cpu_used()
    start = time.perf_counter()
    verifier = Verifier(timeout_s=args.timeout_s, workers=args.workers, max_output_chars=bound)
    startup_s = time.perf_counter() - start
    ours, ours_s = timed_execute(verifier, tasks)
    print(f"[bench] ours: {ours_s:.2f} s ({len(tasks) / ours_s:.0f} tasks/s)", file=sys.stderr)
    defences = verifier.defences()
    verifier.close()  # reaping the server adds its CPU time and its children's to RUSAGE_CHILDREN
    ours_cpu = cpu_used() - cpu0

    subset = tasks[: min(args.baseline_tasks, len(tasks))]
    start = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        base = list(pool.map(lambda t: baseline_task(t, bound, args.timeout_s), subset))
    base_s = time.perf_counter() - start
    base_cpu = cpu_used() - cpu0 - ours_cpu
    print(f"[bench] baseline: {base_s:.2f} s for {len(subset)} tasks ({len(subset) / base_s:.1f} tasks/s)", file=sys.stderr)

    agree = sum(
        (o.status is Status.OK and b == ("ok", o.output)) or (o.status is not Status.OK and b[0] != "ok")
        for o, b in zip(ours, base)
    )
    statuses: dict[str, int] = {}
    for r in ours:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    tasks_per_s = len(tasks) / ours_s
    baseline_tasks_per_s = len(subset) / base_s
    print(json.dumps({
        "bench": "verifier",
        "tasks": len(tasks),
        "workers": args.workers,
        "executions_per_task": 2,
        "ours_s": round(ours_s, 3),
        "tasks_per_s": round(tasks_per_s, 1),
        "executions_per_s": round(2 * tasks_per_s, 1),
        "server_startup_s": round(startup_s, 3),
        "baseline": "fresh `python -c` per execution, twice per task, same checks",
        "baseline_tasks_measured": len(subset),
        "baseline_extrapolated": len(subset) < len(tasks),
        "baseline_s_measured": round(base_s, 3),
        "baseline_tasks_per_s": round(baseline_tasks_per_s, 2),
        "baseline_s_for_all_tasks_extrapolated": round(len(tasks) / baseline_tasks_per_s, 1),
        "speedup": round(tasks_per_s / baseline_tasks_per_s, 2),
        "cpu_ms_per_task_incl_host": round(1e3 * ours_cpu / (len(tasks) + 20), 2),
        "baseline_cpu_ms_per_task": round(1e3 * base_cpu / len(subset), 2),
        "cpu_ratio": round(base_cpu / len(subset) / (ours_cpu / (len(tasks) + 20)), 2),
        "tasks_per_s_on_idle_cores_projected": round(args.workers / (ours_cpu / (len(tasks) + 20)), 1),
        "agreement_with_baseline": round(agree / max(1, len(subset)), 4),
        "statuses": statuses,
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "defences_active": sorted(k for k, v in defences.items() if v is True),
    }))


if __name__ == "__main__":
    main()
