"""Data parallel over the learners (``rl.data_parallel``) on the tiny default, CPU: the train phase with one learner
per role against two replicas per role, on the same real rollouts, and how evenly the split shares the tokens.

The real system (``actors.system.System``, a local Ray cluster) generates one step of ``configs/tiny.yaml``
(match .. judge: ``actors.loop.generate_rollouts``); those samples then train ``--repeats`` times per variant:

- ``one``: one learner per role (data parallel off), ``System.train``: the teacher and the student learner
  run in parallel, so the step waits for the role that drew more tokens (the students);
- ``dp2``: two replicas per role (``resources.learner_gpus=2`` planned, its learners put on the CPU, as in
  ``tests/test_data_parallel_system.py``), ``System.train``: each role split by tokens across its two
  replicas, the gradients exchanged through the object store.

The variants are separate systems (they share actor names), run in the order one, dp2, one so a drift of
the machine's load shows as a difference between the two ``one`` runs. Reported: the median seconds of a
train call per variant and ``dp2_vs_one`` (median dp2 / median of both one runs), and per role each share's
tokens (prompt + completion, ``learners.data_parallel.split_by_tokens`` keyed by member as the replicas
split) over the mean share. Four learner processes on two cores: dp2 can gain only where one learner per role
leaves a core idle (the teachers' few tokens).

Run: ``python -m bench.data_parallel [--repeats 4]`` (a few minutes on two cores, under the machine's lock).
Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any



def log(message: str) -> None:
    print(f"[data_parallel] {message}", file=sys.stderr, flush=True)


def cpu_plan(config: Any) -> Any:
    """The placement of ``config`` with its learners' GPUs dropped: the learner GPUs' shards as CPU processes."""
    from planning.placement import plan_placement

    plan = plan_placement(config)
    plan.actors = [replace(a, num_gpus=0.0, gpu_ids=()) if a.role.startswith("learner") else a for a in plan.actors]
    return plan


def train_seconds(config: Any, plan: Any, model_path: str, samples: list[Any], repeats: int) -> list[float]:
    from actors.system import System

    system = System.start(config, plan, model_path)
    try:
        system.train(samples)  # warm-up: first calls, lazy imports
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            system.train(samples)
            seconds.append(time.perf_counter() - start)
        return seconds
    finally:
        system.stop(release_shared_base=False)


def share_balance(samples: list[Any], shares: int) -> dict[str, list[float]]:
    """Per role: each share's tokens over the mean share, as the replicas split the learner's samples."""
    from learners.data_parallel import split_by_tokens

    out = {}
    for role in sorted({s.role for s in samples}):
        mine = [s for s in samples if s.role == role and s.completion_ids]  # empty completions are not trained
        counts = [len(s.prompt_ids) + len(s.completion_ids) for s in mine]
        loads = [sum(counts[i] for i in idx) for idx in split_by_tokens(counts, shares, [s.member for s in mine])]
        out[role] = [round(load / (sum(counts) / shares), 4) for load in loads]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()

    import ray

    from actors.cluster import NAMESPACE
    from actors.driver import resolve_model
    from actors.loop import generate_rollouts
    from actors.system import System
    from configs import PRESETS_DIR, load_config
    from planning.placement import plan_placement
    from rollouts import StepPrompts

    one = load_config(PRESETS_DIR / "tiny.yaml", [])
    dp2 = load_config(PRESETS_DIR / "tiny.yaml", ["rl.data_parallel=true", "resources.learner_gpus=2"])
    model_path = str(resolve_model(one, progress=False))
    ray.init(num_cpus=max(4, os.cpu_count() or 1), namespace=NAMESPACE, include_dashboard=False, logging_level="WARNING")
    try:
        log("generating one step of the tiny default")
        system = System.start(one, plan_placement(one), model_path)
        try:
            system.publish_adapters()  # the engine serves the members' first versions, as a run's start does
            samples = generate_rollouts(system, 1, StepPrompts.from_config(one, model_path)).samples
        finally:
            system.stop(release_shared_base=False)
        tokens = {role: sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples if s.role == role)
                  for role in sorted({s.role for s in samples})}
        log(f"{len(samples)} samples, tokens per role {tokens}")
        runs: dict[str, list[list[float]]] = {"one": [], "dp2": []}
        for name, config, plan in (("one", one, plan_placement(one)), ("dp2", dp2, cpu_plan(dp2)),
                                   ("one", one, plan_placement(one))):
            runs[name].append(train_seconds(config, plan, model_path, samples, args.repeats))
            log(f"{name}: {runs[name][-1]}")
    finally:
        ray.shutdown()
    one_median = statistics.median([s for run in runs["one"] for s in run])
    dp2_median = statistics.median(runs["dp2"][0])
    print(json.dumps({
        "bench": "data_parallel", "config": "configs/tiny.yaml", "samples": len(samples), "tokens": tokens,
        "train_s": {"one_first": runs["one"][0], "dp2": runs["dp2"][0], "one_last": runs["one"][1]},
        "median_s": {"one": round(one_median, 4), "dp2": round(dp2_median, 4)},
        "dp2_vs_one": round(dp2_median / one_median, 4),
        "share_over_mean": share_balance(samples, 2),
        "load": os.getloadavg(),
    }))


if __name__ == "__main__":
    main()
