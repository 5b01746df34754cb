"""How close the engine replicas finish together: a skewed batch through ``System.generate``, even split against
the work queue, each against the balanced ideal.

1. Start the tiny system (``configs/tiny.yaml`` on a random-init Qwen2 of the tiny model's shape,
   ``planning.measurements.build_model``: it seldom samples EOS, so a request runs to its ``max_tokens`` and the
   skew is the one asked for; ``--model DIR`` another) on a local Ray cluster in the
   stand-in mode (``POPULORA_GPU_STANDIN=1``: ``resources.inference_gpus=2`` logical GPUs, so two engine replicas on
   their CPU path), torch threads 1 in each engine (``POPULORA_INFERENCE_THREADS``). Pin (``--no-pin`` leaves
   them free): every thread of each engine's process is held to its own core (``sched_setaffinity``, re-applied
   before every call), like one GPU per replica; the driver and the idle learners, verifiers and league stay free.
2. Two batches, the members' adapters in turn, each request its own seed (the same batches every time):
   ``skewed``: ``--short`` requests of ``--short-tokens`` new tokens and ``--long`` of ``--long-tokens``, the long
   ones first (``--spread``: at seeded random places; one member's requests are contiguous in a step, so the
   members whose answers run long land together); ``uniform``: as many requests, all of ``--uniform-tokens``
   (what the pieces cost where there is nothing to balance).
3. Generate each ``--rounds`` times with each policy of ``planning.dispatch`` (``even``: one contiguous chunk per
   replica, the split of old; ``queue``: 4 pieces per replica handed out as replicas free up, the system's rule
   without its full-batch floor, ``min_rows=0``; ``longest_first``: the same pieces by expected length, longest
   first), the order rotated round by round so
   machine noise hits each alike. Measured per call: the wall seconds of ``System.generate`` and each replica's
   busy seconds in ``generate`` (``InferenceActor.busy_s``); the balanced ideal is their sum over the replicas.
   Every policy must return the same token ids (each request keeps its seed and adapter).

Reported per batch and policy (medians over rounds): ``wall_s``, ``ideal_s``, ``vs_ideal`` = wall / ideal, and
``vs_queue_ideal`` = wall / the queue's ideal (the policies batch differently, so their busy seconds differ a
little); ``plan_vs_ideal``: the time plan's queue term, 1 + ``planning.dispatch.imbalance_s`` / ideal. Progress
goes to stderr, the last stdout line is one JSON object. Run it as

    nice -n 10 python -m bench.replica_balance
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.cluster import GPU_STANDIN_ENV
from planning.model_files import model_dir_argument


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pin(system: Any, cores: list[int]) -> list[int]:
    """Hold every thread of replica i's process to ``cores[i]``; the processes' ids."""
    import ray

    pids = ray.get([replica.__ray_call__.remote(lambda actor: os.getpid()) for replica in system.inference])
    for pid, core in zip(pids, cores):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(tid), {core})
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
    return pids


def batch(system: Any, budgets: list[int]) -> list[Any]:
    """One request per budget (its ``max_tokens``), the members' adapters in turn, each its own seed."""
    from dataclasses import replace

    members = sorted(system.owners)
    prompts = ["def f(a):\n    return", "def f(xs):\n    total = 0\n    for x in xs:\n", "def f(s):\n    return ''.join(",
               "def f(n):\n    if n < 2:\n        return n\n"]
    return [replace(system.request(members[i % len(members)], prompts[i % len(prompts)], seed=system.seed(0, "b", i)),
                    max_tokens=budget, stop=[]) for i, budget in enumerate(budgets)]


def measure(system: Any, requests: list[Any], rounds: int, cores: list[int] | None, name: str) -> dict[str, Any]:
    """Every policy ``rounds`` times on ``requests``, the order rotated by round; medians and each round."""
    import ray

    from planning.dispatch import imbalance_s

    replicas, policies = len(system.inference), ("even", "queue", "longest_first")
    system.generate(requests)  # every replica warms up on this batch's shapes before anything is timed
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    reference: list[list[int]] | None = None
    for round_ in range(rounds):
        for policy in policies[round_ % 3:] + policies[:round_ % 3]:
            if cores:
                pin(system, cores)
            before = ray.get([r.busy_s.remote() for r in system.inference])
            started = time.perf_counter()
            out = system.generate(requests, policy=policy, min_rows=0)  # pieces below a full batch too
            wall = time.perf_counter() - started
            busy = [b - a for a, b in zip(before, ray.get([r.busy_s.remote() for r in system.inference]))]
            got = [g.token_ids for gens in out for g in gens]
            if reference is not None and got != reference:
                raise SystemExit(f"{name}, {policy}: other token ids than before: samples depend on the replica")
            reference = got
            runs[policy].append({"wall_s": round(wall, 3), "ideal_s": round(sum(busy) / replicas, 3),
                                 "busy_s": [round(b, 3) for b in busy]})
            log(f"{name} round {round_ + 1} {policy:>13}: {wall:6.2f} s, ideal {sum(busy) / replicas:6.2f} s, "
                f"busy {' '.join(f'{b:.2f}' for b in busy)}")
    queue_ideal = statistics.median(r["ideal_s"] for r in runs["queue"])
    result: dict[str, Any] = {"tokens": [len(t) for t in reference or []]}
    for policy, rows in runs.items():
        wall, ideal = statistics.median(r["wall_s"] for r in rows), statistics.median(r["ideal_s"] for r in rows)
        result[policy] = {"wall_s": round(wall, 3), "ideal_s": round(ideal, 3), "vs_ideal": round(wall / ideal, 3),
                          "vs_queue_ideal": round(wall / queue_ideal, 3), "rounds": rows}
    result["plan_vs_ideal"] = round(1 + imbalance_s(queue_ideal * replicas, replicas) / queue_ideal, 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="calls per policy and batch (default 3)")
    parser.add_argument("--short", type=int, default=28, help="short requests (default 28)")
    parser.add_argument("--long", type=int, default=4, help="long requests (default 4)")
    parser.add_argument("--short-tokens", type=int, default=16, help="max_tokens of a short request (default 16)")
    parser.add_argument("--long-tokens", type=int, default=192, help="max_tokens of a long request (default 192)")
    parser.add_argument("--uniform-tokens", type=int, default=40, help="max_tokens of the uniform batch (default 40)")
    parser.add_argument("--spread", action="store_true", help="the long requests at random places, not first")
    parser.add_argument("--model", type=model_dir_argument, help="a local causal LM (default: a random-init one of the tiny shape)")
    parser.add_argument("--no-pin", action="store_true", help="leave the engines' processes on every core")
    parser.add_argument("overrides", nargs="*", metavar="dotted.key=value", help="settings of the system")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))[:2]
    if not args.no_pin and len(cores) < 2:
        parser.error("pinning needs two cores (one per engine replica); use --no-pin")
    os.environ[GPU_STANDIN_ENV] = "1"  # before Ray starts: its workers inherit it
    os.environ["POPULORA_INFERENCE_THREADS"] = "1"
    import ray

    from actors.cluster import NAMESPACE
    from actors.system import System
    from configs import PRESETS_DIR, load_config
    from planning.measurements import build_model
    from planning.placement import plan_placement

    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(args.model or build_model(Path(tmp) / "model"))
        config = load_config(PRESETS_DIR / "tiny.yaml", [f"model.path={model_path}", "resources.inference_gpus=2",
                                                          "resources.inference_cpus=1", "verifier.actors=1", *args.overrides])
        ray.init(address="local", num_cpus=max(6, os.cpu_count() or 1), num_gpus=2, namespace=NAMESPACE,
                 include_dashboard=False, logging_level="WARNING")
        system = System.start(config, plan_placement(config), model_path)
        try:
            system.publish_adapters(all_members=True)
            pids = None if args.no_pin else pin(system, cores)
            budgets = [args.long_tokens] * args.long + [args.short_tokens] * args.short
            if args.spread:
                random.Random(0).shuffle(budgets)
            load = os.getloadavg()
            results = {name: measure(system, batch(system, b), args.rounds, None if args.no_pin else cores, name)
                       for name, b in (("skewed", budgets), ("uniform", [args.uniform_tokens] * len(budgets)))}
            load = [round(a, 2) for a in load + os.getloadavg()]
        finally:
            system.stop()
            ray.shutdown()
    print(json.dumps({
        "replicas": len(system.inference), "pinned": None if args.no_pin else {"cores": cores, "pids": pids},
        "batch": {"short": args.short, "long": args.long, "short_tokens": args.short_tokens,
                  "long_tokens": args.long_tokens, "uniform_tokens": args.uniform_tokens, "long_first": not args.spread},
        "load_avg_before_after": load, "cpus": os.cpu_count(), **results,
    }))


if __name__ == "__main__":
    main()
