"""A multi-seed study of the population against the single agent (``bench/dynamics.py``): the numbers behind
the paper's dynamics claims, from the kept runs' ``metrics.jsonl`` rows. Pure maths (numpy; no Ray, no plots).

Per arm (population, single agent) and metric, over its S seeds (each seed one run):

- **band**: per step the seed mean of the seeds' smoothed series (centred rolling means) and its 95 % interval,
  ybar_t +- t_{0.975, S-1} s_t / sqrt(S) (S >= 2; one seed has no band);
- **pooled slope**: the OLS line of y on the step over every measured (seed, step) point
  (``reporting.report_trends.fit_line``), per 100 steps, +- its 95 % CI. The points of one seed are not
  independent (a run drifts), so the CI is a lower bound on the uncertainty; the per-seed slopes are
  reported beside it, and a sign claim holds only where every seed agrees with the pooled line.
- **diagnostics** of the suspects in issue 40: the share of valid tasks never solved (rho = 0: a teacher
  "win" that is only validity), the share of buffer draws that are still seed tasks, coverage per written
  program and at an equal number of written programs, the lineages left after evolution, the proposer's
  share of the single agent's tokens (its proposer gradient's scale against a population teacher's).

Claims (verdict ``holds``, ``fails`` or ``inconclusive``):

- ``single_complexity_down``: every complexity metric of the single agent's written programs falls (holds),
  or one rises (fails);
- ``population_complexity_not_down``: no complexity metric of the population's written programs falls
  (holds), or one does (fails);
- ``population_coverage_per_proposal_higher``, ``population_mean_probe_ge_single``,
  ``weakest_member_probe_ge_single``: the difference population - single with its 95 % CI is above 0
  (holds), below 0 (fails), or straddles it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Sequence

import numpy as np

from reporting.report_summary import CUMULATIVE, series
from reporting.report_trends import fit_line, rolling_mean, smoothing_half_width, t_quantile_975

Rows = list[dict[str, Any]]

COMPLEXITY = ("program_ast_depth", "program_cyclomatic", "program_loc", "program_variables")
"""The paper's four complexity metrics, of the programs the teachers wrote."""
BUFFER_COMPLEXITY = tuple(f"buffer_{k}" for k in COMPLEXITY)
RATES = ("valid_rate", "solve_rate", "teacher_reward", "student_reward", "buffer_seed_share", "unsolved_share")
TRENDED = COMPLEXITY + BUFFER_COMPLEXITY + RATES
PER = 100.0
"""Slopes are reported per this many steps."""


def unsolved_share(row: dict[str, Any]) -> float | None:
    """The share of a step's valid tasks that no rollout solved (rho = 0: ``rho_histogram[0]``), None without any."""
    hist = row.get("rho_histogram") or []
    total = sum(hist)
    return hist[0] / total if total else None


def with_derived(rows: Rows) -> Rows:
    """``rows`` with ``unsolved_share`` added where it is defined."""
    out = []
    for row in rows:
        share = unsolved_share(row)
        out.append({**row, "unsolved_share": share} if share is not None else dict(row))
    return out


@dataclass(frozen=True)
class Slope:
    """An OLS slope per ``PER`` steps with its 95 % CI half-width, the pooled line's direction
    (``LineFit.direction``) and the per-seed slopes beside it."""

    slope: float
    ci: float
    pooled_direction: str
    per_seed: tuple[float, ...]

    @property
    def direction(self) -> str:
        """The pooled line's "rises"/"falls" where every seed's slope has that sign, else "flat"."""
        sign = {"rises": 1, "falls": -1}.get(self.pooled_direction, 0)
        return self.pooled_direction if sign and all(s * sign > 0 for s in self.per_seed) else "flat"

    def as_dict(self) -> dict[str, Any]:
        return {"slope": round(self.slope, 4), "ci": round(self.ci, 4), "per_seed": [round(s, 4) for s in self.per_seed],
                "direction": self.direction}


def pooled_slope(runs: Sequence[Rows], key: str) -> Slope | None:
    """The OLS slope of ``key`` over every seed's measured points (module docstring); None under 3 points."""
    xs, ys, per_seed = [], [], []
    for rows in runs:
        x, y = series(rows, key)
        xs.append(x)
        ys.append(y)
        if len(x) >= 3 and np.ptp(x) > 0:
            per_seed.append(fit_line(x, y).slope * PER)
    x, y = np.concatenate(xs) if xs else np.array([]), np.concatenate(ys) if ys else np.array([])
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    fit = fit_line(x, y)
    return Slope(fit.slope * PER, fit.slope_ci * PER, fit.direction, tuple(per_seed))


def seed_band(runs: Sequence[Rows], key: str, smooth: bool = True) -> dict[str, list[float]]:
    """Per step measured by every seed: ``steps``, the seed ``mean``, and ``lo``/``hi`` of its 95 % interval.
    With ``smooth`` each seed's series is first its centred rolling mean (``reporting.report_trends``; running
    totals are left as they are), so the band is that of the seeds' trajectories, not of one step's noise."""
    per_run = []
    for rows in runs:
        steps, values = series(rows, key)
        if smooth and key not in CUMULATIVE:
            values = rolling_mean(values, smoothing_half_width(len(values)))
        per_run.append(dict(zip(steps, values)))
    steps = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    mean, lo, hi = [], [], []
    for step in steps:
        m, half = mean_ci([d[step] for d in per_run])
        mean.append(m)
        lo.append(m - half)
        hi.append(m + half)
    return {"steps": [float(s) for s in steps], "mean": mean, "lo": lo, "hi": hi}


def block_means(rows: Rows, key: str, blocks: int = 6) -> tuple[float | None, float | None]:
    """The mean of ``key`` over the first and the last of ``blocks`` equal blocks of measured steps."""
    x, y = series(rows, key)
    if len(y) == 0:
        return None, None
    size = max(1, len(y) // blocks)
    return float(y[:size].mean()), float(y[-size:].mean())


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its 95 % t interval (0 for one value)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), 0.0
    return float(v.mean()), t_quantile_975(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))


def difference(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """mean(a) - mean(b) with a 95 % CI from the two seed samples (Welch: the half-widths add in quadrature)."""
    ma, ha = mean_ci(a)
    mb, hb = mean_ci(b)
    return {"difference": round(ma - mb, 4), "ci": round(math.hypot(ha, hb), 4), "a": round(ma, 4), "b": round(mb, 4)}


def proportion_difference(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Pooled solve rates p_a - p_b (``(correct, answers)`` per model) +- 1.96 sqrt(p_a q_a / n_a + p_b q_b / n_b)."""
    ca, na = sum(c for c, _ in a), sum(n for _, n in a)
    cb, nb = sum(c for c, _ in b), sum(n for _, n in b)
    if not na or not nb:
        raise ValueError("a probe comparison needs answers on both sides")
    pa, pb = ca / na, cb / nb
    half = 1.96 * math.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb)
    return {"difference": round(pa - pb, 4), "ci": round(half, 4), "a": round(pa, 4), "b": round(pb, 4)}


def verdict_difference(d: dict[str, float]) -> str:
    if d["difference"] - d["ci"] > 0:
        return "holds"
    if d["difference"] + d["ci"] < 0:
        return "fails"
    return "inconclusive"


def written_in(row: dict[str, Any]) -> int:
    """Programs the teachers wrote at this step (rows from before ``written_programs``: their valid tasks)."""
    return int(row.get("written_programs", row.get("valid_tasks", 0)))


def written_total(rows: Rows) -> int:
    return sum(written_in(r) for r in rows)


def coverage_per_program(rows: Rows) -> float:
    """Distinct AST n-grams of the written programs at the end over the programs written in the run."""
    total = written_total(rows)
    return rows[-1]["coverage"] / total if total else 0.0


def coverage_at(rows: Rows, programs: int) -> float:
    """The coverage of the run when it had written ``programs`` programs (the last step at or below that count)."""
    seen, coverage = 0, 0
    for row in rows:
        seen += written_in(row)
        if seen > programs:
            break
        coverage = row["coverage"]
    return float(coverage)


def lineages(rows: Rows) -> int:
    """How many founding members (step 1's) have descendants (or themselves) alive at the end."""
    founders = {m["id"]: m["id"] for m in rows[0].get("members", [])} if rows else {}
    for row in rows:
        for event in row.get("evolution") or []:
            parents = event.get("parents") or []
            if event.get("child") and parents:
                founders[event["child"]] = founders.get(parents[0], parents[0])
    alive = [m["id"] for m in rows[-1].get("members", [])] if rows else []
    return len({founders.get(m, m) for m in alive})


def proposer_token_share(rows: Rows) -> float | None:
    """The teacher role's share of completion tokens (the single agent's proposer gradient is scaled by it,
    since its loss averages over both roles' tokens, N_a; ``learners.pg_loss``)."""
    teacher = sum(r.get("tokens", {}).get("teacher", {}).get("completion", 0) for r in rows)
    student = sum(r.get("tokens", {}).get("student", {}).get("completion", 0) for r in rows)
    return teacher / (teacher + student) if teacher + student else None


def seed_drain_step(rows: Rows, below: float = 0.1) -> int | None:
    """The first step whose buffer draws are less than ``below`` seed tasks (None if never)."""
    for row in rows:
        if row.get("buffer_programs") and row.get("buffer_seed_share", 1.0) < below:
            return int(row["step"])
    return None


def rho_by_teacher(rows: Rows) -> dict[str, list[int]]:
    """Each teacher's rho histogram (``reporting.step_metrics.rho_histogram`` bins) summed over the run."""
    out: dict[str, list[int]] = {}
    for row in rows:
        for teacher, hist in (row.get("rho_by_teacher") or {}).items():
            acc = out.setdefault(teacher, [0] * len(hist))
            out[teacher] = [a + h for a, h in zip(acc, hist)]
    return out


def arm_summary(runs: Sequence[Rows]) -> dict[str, Any]:
    """Per metric the pooled slope, first/last block means (seed mean), and the arm's diagnostics."""
    runs = [with_derived(rows) for rows in runs]
    metrics: dict[str, Any] = {}
    for key in TRENDED:
        slope = pooled_slope(runs, key)
        firsts, lasts = zip(*(block_means(rows, key) for rows in runs))
        first = [v for v in firsts if v is not None]
        last = [v for v in lasts if v is not None]
        metrics[key] = {**(slope.as_dict() if slope else {"slope": None, "ci": None, "per_seed": [], "direction": "flat"}),
                        "first": round(fmean(first), 4) if first else None,
                        "last": round(fmean(last), 4) if last else None}
    coverage = [float(rows[-1]["coverage"]) for rows in runs]
    per_program = [coverage_per_program(rows) for rows in runs]
    shares = [s for s in (proposer_token_share(rows) for rows in runs) if s is not None]
    drains = [seed_drain_step(rows) for rows in runs]
    return {
        "seeds": len(runs),
        "steps": [int(rows[-1]["step"]) for rows in runs],
        "metrics": metrics,
        "coverage_end": round(fmean(coverage), 2),
        "coverage_per_program": [round(v, 4) for v in per_program],
        "written_programs": [written_total(rows) for rows in runs],
        "lineages_end": [lineages(rows) for rows in runs],
        "proposer_token_share": round(fmean(shares), 4) if shares else None,
        "seed_drain_step": drains,
        "rho_by_teacher": [rho_by_teacher(rows) for rows in runs],
    }


def complexity_verdicts(single: dict[str, Any], population: dict[str, Any]) -> dict[str, str]:
    """``single_complexity_down`` and ``population_complexity_not_down`` (module docstring)."""
    s = [single["metrics"][k]["direction"] for k in COMPLEXITY]
    p = [population["metrics"][k]["direction"] for k in COMPLEXITY]
    return {
        "single_complexity_down": "holds" if all(d == "falls" for d in s) else ("fails" if "rises" in s else "inconclusive"),
        "population_complexity_not_down": "fails" if "falls" in p else "holds",
    }


def study_summary(population: Sequence[Rows], single: Sequence[Rows],
                  probes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Both arms' summaries, the comparisons and every claim's verdict. ``probes`` (optional):
    ``{"population": [[(correct, answers) per student] per seed], "single": [[(correct, answers)] per seed],
    "base": (correct, answers)}``."""
    pop, sin = arm_summary(population), arm_summary(single)
    claims: dict[str, Any] = {}
    verdicts = complexity_verdicts(sin, pop)
    per_program = difference(pop["coverage_per_program"], sin["coverage_per_program"])
    matched_programs = min(min(pop["written_programs"]), min(sin["written_programs"]))
    matched = difference([coverage_at(rows, matched_programs) for rows in population],
                         [coverage_at(rows, matched_programs) for rows in single])
    claims["coverage_per_program"] = per_program
    claims["coverage_at_equal_programs"] = {**matched, "programs": matched_programs}
    verdicts["population_coverage_per_proposal_higher"] = verdict_difference(per_program)
    if probes is not None:
        pop_models = [m for seed in probes["population"] for m in seed]
        weakest = [min(seed, key=lambda cn: cn[0] / cn[1]) for seed in probes["population"]]
        single_models = [m for seed in probes["single"] for m in seed]
        mean_vs = proportion_difference(pop_models, single_models)
        weak_vs = proportion_difference(weakest, single_models)
        claims["probe_population_mean_minus_single"] = mean_vs
        claims["probe_weakest_member_minus_single"] = weak_vs
        base_c, base_n = probes["base"]
        claims["probe_base"] = round(base_c / base_n, 4)
        verdicts["population_mean_probe_ge_single"] = verdict_difference(mean_vs)
        verdicts["weakest_member_probe_ge_single"] = verdict_difference(weak_vs)
    return {"population": pop, "single": sin, "comparisons": claims, "verdicts": verdicts}
