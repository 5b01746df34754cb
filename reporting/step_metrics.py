"""The metrics row of one step (one line of ``metrics.jsonl``), from what the step produced.

Keys: ``step``, ``members`` (id, role, mu, sigma, conservative, parent, reward), ``valid_rate``,
``solve_rate`` (solved rollouts over all rollouts of valid tasks), ``teacher_reward``,
``student_reward``, ``program_*`` (mean complexity of the valid proposals' programs),
``coverage`` (distinct AST node-type n-grams seen so far), ``distinct_structures``, ``new_structures``, ``rho`` (histogram),
``matches``, ``per_family``, ``phase_seconds``, ``evolution``, ``train`` (per-member learner stats);
``prompt_style``, ``prompt_budget``, ``prompt_tokens_max``, ``references_dropped``, ``dropped_requests``
(per role) and ``dropped_reasons`` (requests the engine rejected because they did not fit the context);
``examples`` (a few raw proposals and answers) is moved by the driver to ``samples.jsonl``.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Any, Sequence

from verifier.metrics import program_metrics

RHO_BINS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _mean(values: Sequence[float]) -> float:
    return round(fmean(values), 4) if values else 0.0


def rho_histogram(rho: Sequence[float | None]) -> list[int]:
    """Counts of valid tasks with rho = 0, (0, .25], (.25, .5], (.5, .75], (.75, 1)... and rho = 1."""
    valid = [r for r in rho if r is not None]
    edges = list(RHO_BINS)
    counts = [sum(1 for r in valid if r == 0.0)]
    counts += [sum(1 for r in valid if lo < r <= hi and r < 1.0) for lo, hi in zip(edges, edges[1:])]
    counts.append(sum(1 for r in valid if r == 1.0))
    return counts


def examples(proposals: Sequence[Any], validations: Sequence[Any], solves: Sequence[Any],
             judgements: Sequence[Sequence[Any]], per_teacher: int = 2) -> list[dict[str, Any]]:
    """A few raw proposals (valid or not, with the verifier's reason) and student answers, for reading."""
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = defaultdict(int)
    for i, (job, verdict) in enumerate(zip(proposals, validations)):
        if seen[job.teacher] >= per_teacher:
            continue
        seen[job.teacher] += 1
        record = {"kind": "proposal", "member": job.teacher, "family": job.family, "valid": verdict.valid,
                  "reason": verdict.reason, "text": job.text}
        solve = next((k for k, s in enumerate(solves) if s.proposal == i), None)
        if solve is not None and solves[solve].generations:
            answer = solves[solve].generations[0]
            record["answer"] = {"member": solves[solve].student, "text": answer.text,
                                "correct": judgements[solve][0].correct, "reason": judgements[solve][0].reason}
        out.append(record)
    return out


def step_row(
    step: int,
    members: list[dict[str, Any]],
    coverage: Any,
    families: Sequence[str],
    proposals: Sequence[Any],
    validations: Sequence[Any],
    solves: Sequence[Any],
    judgements: Sequence[Sequence[Any]],
    rho: Sequence[float | None],
    samples: Sequence[Any],
    train_stats: dict[str, Any],
    events: list[dict[str, Any]],
    phase_seconds: dict[str, float],
    prompts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The row (pure: the loop passes the league's ``members``, the run's ``coverage`` tracker and the task
    ``families``); ``prompts`` (``rollouts.prompt_metrics``: prompt sizes, trimmed references, dropped
    requests with their reasons) is merged in."""
    programs = [v.task.program for v in validations if v.valid]
    complexity = [program_metrics(p) for p in programs]
    new = coverage.update(programs)
    verdicts = [v for per_task in judgements for v in per_task]

    rewards: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        rewards[sample.member].append(sample.reward)
    per_family: dict[str, dict[str, float]] = {}
    for family in families:
        fam = [i for i, p in enumerate(proposals) if p.family == family]
        solved = [rho[i] for i in fam if rho[i] is not None]
        per_family[family] = {
            "proposals": len(fam),
            "valid_rate": _mean([float(rho[i] is not None) for i in fam]),
            "mean_rho": _mean(solved),
        }

    for member in members:
        member["reward"] = _mean(rewards.get(member["id"], []))
    return {
        "step": step,
        "members": members,
        "valid_rate": _mean([float(v.valid) for v in validations]),
        "solve_rate": _mean([float(bool(v.correct)) for v in verdicts]),
        "teacher_reward": _mean([s.reward for s in samples if s.role == "teacher"]),
        "student_reward": _mean([s.reward for s in samples if s.role == "student"]),
        "program_ast_depth": _mean([m["ast_depth"] for m in complexity]),
        "program_cyclomatic": _mean([m["cyclomatic"] for m in complexity]),
        "program_loc": _mean([m["loc"] for m in complexity]),
        "program_variables": _mean([m["variables"] for m in complexity]),
        "coverage": len(coverage.ngrams),
        "distinct_structures": len(coverage.structures),
        "new_structures": new["new_structures"],
        "valid_tasks": len(programs),
        "rollouts": len(verdicts),
        "rho_histogram": rho_histogram(rho),
        "matches": sorted({(p.teacher, p.student) for p in proposals}),
        "per_family": per_family,
        "phase_seconds": phase_seconds,
        "evolution": events,
        "train": train_stats,
        "examples": examples(proposals, validations, solves, judgements),
        **(prompts or {}),
    }
