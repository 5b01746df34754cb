"""Benchmark: the fork-server verifier against a naive ``python -c`` per execution.

Both sides run the same AZR-style tasks twice (the determinism check) over the same number of
parallel workers and apply the same checks (the repr must be a literal no longer than the bound).
The baseline is slow, so by default it runs on a subset of the tasks and its rate is extrapolated
(the JSON says so). Progress goes to stderr; the last stdout line is one JSON object.

    nice -n 10 python bench/verifier.py [--tasks 1000] [--baseline-tasks 150] [--workers 2]
    nice -n 10 python bench/verifier.py --layer-costs [--tasks 400] [--rounds 3]

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
import random
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verifier.sandbox import Status, Verifier  # noqa: E402

LAYER_CONFIGS = {
    "all_layers": (),
    "no_namespaces": ("namespaces",),
    "no_landlock": ("landlock",),
    "no_seccomp": ("seccomp",),
    "none_of_the_three": ("namespaces", "landlock", "seccomp"),
}

# Typical AZR proposals: a few lines to a few dozen, the allowed modules, classes, recursion.
TEMPLATES = [
    ("def f(s: str, k: int):\n    out = []\n    for i, ch in enumerate(s):\n        if ch.isalpha():\n"
     "            base = ord('a') if ch.islower() else ord('A')\n            out.append(chr((ord(ch) - base + k * (i % 3 + 1)) % 26 + base))\n"
     "        else:\n            out.append(ch)\n    return ''.join(out)", lambda r: f"{r.choice(['Hello world', 'abc XYZ', 'Zebra!'])!r}, {r.randint(1, 9)}"),
    ("from collections import Counter, defaultdict\n\ndef f(words):\n    counts = Counter(words)\n    groups = defaultdict(list)\n"
     "    for w, c in counts.items():\n        groups[c].append(w)\n    return sorted((c, sorted(ws)) for c, ws in groups.items())",
     lambda r: repr([r.choice(["a", "b", "cc", "d", "ee"]) for _ in range(r.randint(3, 12))])),
    ("import heapq\n\ndef f(edges, start):\n    graph = {}\n    for a, b, w in edges:\n        graph.setdefault(a, []).append((b, w))\n"
     "        graph.setdefault(b, []).append((a, w))\n    dist = {start: 0}\n    heap = [(0, start)]\n    while heap:\n"
     "        d, node = heapq.heappop(heap)\n        if d > dist.get(node, float('inf')):\n            continue\n"
     "        for nxt, w in graph.get(node, []):\n            nd = d + w\n            if nd < dist.get(nxt, float('inf')):\n"
     "                dist[nxt] = nd\n                heapq.heappush(heap, (nd, nxt))\n    return sorted(dist.items())",
     lambda r: f"{[(r.randint(0, 5), r.randint(0, 5), r.randint(1, 9)) for _ in range(r.randint(3, 8))]!r}, 0"),
    ("from functools import lru_cache\n\ndef f(n: int, m: int):\n    @lru_cache(maxsize=None)\n    def paths(i, j):\n"
     "        if i == 0 or j == 0:\n            return 1\n        return paths(i - 1, j) + paths(i, j - 1)\n    return paths(n, m) % 1000007",
     lambda r: f"{r.randint(2, 30)}, {r.randint(2, 30)}"),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n\n"
     "    def pop(self):\n        return self.items.pop() if self.items else None\n\n\ndef f(ops):\n    s = Stack()\n    out = []\n"
     "    for op in ops:\n        if op == 'pop':\n            out.append(s.pop())\n        else:\n            s.push(op)\n    return out",
     lambda r: repr([r.choice(["pop", 1, 2, "x", 3]) for _ in range(r.randint(2, 10))])),
    ("import itertools\n\ndef f(xs, k):\n    best = None\n    for combo in itertools.combinations(xs, k):\n        s = sum(combo)\n"
     "        if s % 2 == 0 and (best is None or s > best[0]):\n            best = (s, combo)\n    return best",
     lambda r: f"{[r.randint(-5, 20) for _ in range(r.randint(3, 7))]!r}, {r.randint(1, 3)}"),
    ("import re\n\ndef f(text):\n    tokens = re.findall(r'[A-Za-z]+|\\d+', text)\n    nums = [int(t) for t in tokens if t.isdigit()]\n"
     "    words = [t.lower() for t in tokens if t.isalpha()]\n    return {'sum': sum(nums), 'words': sorted(set(words))}",
     lambda r: repr(r.choice(["a1 b22 C3", "x 10 y 20 z", "The 3 little pigs 7"]))),
    ("from dataclasses import dataclass\nfrom typing import List\n\n@dataclass\nclass Item:\n    name: str\n    weight: int\n    value: int\n\n"
     "def f(items: List[tuple], cap: int):\n    objs = [Item(*t) for t in items]\n    dp = [0] * (cap + 1)\n    for it in objs:\n"
     "        for c in range(cap, it.weight - 1, -1):\n            dp[c] = max(dp[c], dp[c - it.weight] + it.value)\n    return dp[cap]",
     lambda r: f"{[('i%d' % k, r.randint(1, 6), r.randint(1, 10)) for k in range(r.randint(2, 6))]!r}, {r.randint(5, 15)}"),
    ("def f(n):\n    def collatz(x):\n        steps = 0\n        while x != 1:\n            x = x // 2 if x % 2 == 0 else 3 * x + 1\n"
     "            steps += 1\n        return steps\n    return max(range(1, n + 1), key=collatz)", lambda r: str(r.randint(5, 300))),
    ("import math\nfrom fractions import Fraction\n\ndef f(a, b):\n    g = math.gcd(a, b)\n    fr = Fraction(a, b)\n"
     "    return (g, fr.numerator, fr.denominator, round(math.sqrt(a * b), 3))", lambda r: f"{r.randint(1, 500)}, {r.randint(1, 500)}"),
    ("def f(matrix):\n    rows, cols = len(matrix), len(matrix[0])\n    out = []\n    top, bottom, left, right = 0, rows - 1, 0, cols - 1\n"
     "    while top <= bottom and left <= right:\n        out.extend(matrix[top][left:right + 1])\n        for i in range(top + 1, bottom + 1):\n"
     "            out.append(matrix[i][right])\n        if top < bottom:\n            out.extend(matrix[bottom][left:right][::-1])\n"
     "        if left < right:\n            for i in range(bottom - 1, top, -1):\n                out.append(matrix[i][left])\n"
     "        top, bottom, left, right = top + 1, bottom - 1, left + 1, right - 1\n    return out",
     lambda r: repr([[r.randint(0, 9) for _ in range(3)] for _ in range(r.randint(1, 4))])),
    ("from collections import deque\n\ndef f(grid):\n    h, w = len(grid), len(grid[0])\n    seen = set()\n    regions = 0\n"
     "    for i in range(h):\n        for j in range(w):\n            if grid[i][j] == '#' and (i, j) not in seen:\n                regions += 1\n"
     "                q = deque([(i, j)])\n                seen.add((i, j))\n                while q:\n                    a, b = q.popleft()\n"
     "                    for da, db in ((1, 0), (-1, 0), (0, 1), (0, -1)):\n                        na, nb = a + da, b + db\n"
     "                        if 0 <= na < h and 0 <= nb < w and grid[na][nb] == '#' and (na, nb) not in seen:\n"
     "                            seen.add((na, nb))\n                            q.append((na, nb))\n    return regions",
     lambda r: repr(["".join(r.choice("#.") for _ in range(5)) for _ in range(4)])),
]


def make_tasks(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (program, args) pairs: the templates with varied inputs and an extra constant so
    no two programs are byte-identical."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        program, make_args = TEMPLATES[i % len(TEMPLATES)]
        tasks.append((f"{program}\n\nVERSION = {i}\n", make_args(rng)))
    return tasks


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


def timed_execute(verifier: Verifier, tasks: list[tuple[str, str]]) -> tuple[list, float]:
    """Each task run twice (the determinism check) on a started ``verifier``, after a warm-up of 20: the results
    and the wall seconds. Tasks per second per worker is the time plan's ``host.verifier_tasks_per_core_s``
    (``bench/calibrate.py``)."""
    verifier.execute_many(tasks[:20])  # warm the reader thread and caches
    start = time.perf_counter()
    results = verifier.execute_many(tasks)
    return results, time.perf_counter() - start


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
