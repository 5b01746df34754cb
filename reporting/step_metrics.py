"""The metrics row of one step (one line of ``metrics.jsonl``), from what the step produced.

Keys: ``step``, ``members`` (id, role, mu, sigma, conservative, parent, reward), ``valid_rate``,
``solve_rate`` (solved rollouts over all rollouts of valid tasks), ``teacher_reward``,
``student_reward`` (sampled completions only), ``hindsight_targets`` (supervised targets, ``rollouts.hindsight``),
``program_*`` (mean complexity of the programs the teachers wrote: valid code_o and
code_i proposals, ``written_programs`` of them; a code_f proposal writes inputs for a buffer program, so its
program is not counted), ``buffer_program_*`` (the same of the programs drawn from the buffers for this
step's prompts, ``buffer_programs`` of them: references and code_f probes, a uniform sample of the buffers)
and ``buffer_seed_share`` (the fraction of those that are seed tasks, not proposed in the run),
``coverage`` (distinct AST node-type n-grams seen so far in written programs), ``distinct_structures``,
``new_structures``, ``rho_histogram`` (all valid tasks) and ``rho_by_teacher`` (per teacher),
``matches``, ``per_family``, ``phase_seconds``, ``evolution``, ``train`` (per-member learner stats), and of those
stats the readouts of how far each adapter moved as flat scalars for the trackers (``TRAIN_SCALARS``:
``update_norm/<member>`` every update, ``kl_to_base/<member>`` where the step took the KL readout);
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
COMPLEXITY_KEYS = ("ast_depth", "cyclomatic", "loc", "variables")
WRITTEN_FAMILIES = ("code_o", "code_i")
"""Families whose proposal carries a program the teacher wrote (code_f probes a buffer program)."""
TRAIN_SCALARS = ("kl_to_base", "update_norm")
"""Per-member learner stats copied to top-level ``<stat>/<member>`` keys (the trackers log top-level scalars)."""


def train_scalars(train_stats: dict[str, Any]) -> dict[str, float]:
    """``{"<stat>/<member>": value}`` for each stat of :data:`TRAIN_SCALARS` a member's update reported."""
    return {f"{key}/{member}": stats[key] for member, stats in sorted(train_stats.items()) for key in TRAIN_SCALARS
            if key in stats}


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


def complexity_means(programs: Sequence[str], prefix: str) -> dict[str, float]:
    """``{prefix + key: mean}`` of ``verifier.metrics.program_metrics`` over ``programs`` (0.0 for none)."""
    measured = [program_metrics(p) for p in programs]
    return {f"{prefix}{key}": _mean([m[key] for m in measured]) for key in COMPLEXITY_KEYS}


def written_programs(proposals: Sequence[Any], validations: Sequence[Any]) -> list[str]:
    """The programs the teachers wrote that made valid tasks (code_o and code_i proposals)."""
    return [v.task.program for job, v in zip(proposals, validations) if v.valid and job.family in WRITTEN_FAMILIES]


def buffer_draws(proposals: Sequence[Any]) -> list[Any]:
    """The tasks drawn from the buffers for this step's prompts (references and code_f probes)."""
    return [task for job in proposals for task in job.reference_tasks]


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
    programs = written_programs(proposals, validations)
    drawn = buffer_draws(proposals)
    new = coverage.update(programs)
    teachers = sorted({p.teacher for p in proposals})
    verdicts = [v for per_task in judgements for v in per_task]

    targets = [s for s in samples if s.fixed_advantage is not None]  # hindsight: not sampled
    samples = [s for s in samples if s.fixed_advantage is None]
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
        "hindsight_targets": len(targets),
        **complexity_means(programs, "program_"),
        "written_programs": len(programs),
        **complexity_means([t.program for t in drawn], "buffer_program_"),
        "buffer_programs": len(drawn),
        "buffer_seed_share": _mean([float("step" not in t.meta) for t in drawn]),
        "coverage": len(coverage.ngrams),
        "distinct_structures": len(coverage.structures),
        "new_structures": new["new_structures"],
        "valid_tasks": sum(bool(v.valid) for v in validations),
        "rollouts": len(verdicts),
        "rho_histogram": rho_histogram(rho),
        "rho_by_teacher": {t: rho_histogram([r for p, r in zip(proposals, rho) if p.teacher == t]) for t in teachers},
        "matches": sorted({(p.teacher, p.student) for p in proposals}),
        "per_family": per_family,
        "phase_seconds": phase_seconds,
        "evolution": events,
        "train": train_stats,
        **train_scalars(train_stats),
        "examples": examples(proposals, validations, solves, judgements),
        **(prompts or {}),
    }
