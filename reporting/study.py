"""A multi-seed study of the population against the single agent (``studies/dynamics.py``): the numbers behind
the paper's dynamics claims, from the kept runs' ``metrics.jsonl`` rows. Pure maths (numpy; no Ray, no plots).

**The seed is the unit.** The steps of one run are autocorrelated (a run drifts), so no statistic here counts
them as independent points. Per arm (population, single agent) and metric, over its S seeds (each seed one run):

- **band**: per step the seed mean of the seeds' smoothed series (centred rolling means) and its 95 % interval,
  ybar_t +- t_{0.975, S-1} s_t / sqrt(S) (S >= 2; one seed has no band);
- **slope**: each seed's own OLS slope b_s of y on the step (per 100 steps), then their mean with the t interval
  on S - 1 degrees of freedom, bbar +- t_{0.975, S-1} sd(b) / sqrt(S);
- **the arms' difference** (the paper's claim is that the arms diverge: an arm x step interaction):
  bbar_pop - bbar_single with Welch's interval, se = sqrt(sd_p^2 / S_p + sd_s^2 / S_s), on the
  Welch-Satterthwaite degrees of freedom (rounded down: the integer-df t of ``reporting.report_trends``, so the
  interval is slightly wide). The seeds of the two arms share a seed number but no randomness that pairs them
  (different members, different draws), so they are not paired;
- **probes**: held-out tasks answered by every final student; the difference population - single is paired by
  task (both arms answer the same tasks) and its interval is a percentile bootstrap that resamples the tasks
  (once per replicate, for both arms) and each arm's seeds (``paired_probe_difference``). The weakest member (the
  minimum over a seed's n students) is compared with the minimum of n resampled answer sets of the single agent,
  not with its one measured rate: the minimum of n noisy rates is biased low by the noise alone;
- **coverage** at an equal number of written programs (``coverage_at_equal_programs``: the population writes
  about twice the programs and coverage is concave in their count, so per program or per step the comparison is
  decided by construction; coverage per written program is kept beside it as a diagnostic);
- **diagnostics** of what may bias the loop: the share of valid tasks never solved (rho = 0: a teacher
  "win" that is only validity), the share of buffer draws that are still seed tasks, coverage per written
  program, the lineages left after evolution, the proposer's share of the single agent's tokens (its proposer
  gradient's scale against a population teacher's), and per role the members' mean of three readouts of their
  updates (``train.<member>.<stat>``, :data:`MEMBER_STATS`): the mean token entropy, the KL to the base on their
  own samples (every ``rl.kl_readout_every`` steps) and the norm of the parameter update.

**Verdicts** (``holds``, ``fails``, ``inconclusive``) follow one rule each way: a claim holds when its 95 %
interval lies wholly on the claimed side of 0, fails when it lies wholly on the other side, and is inconclusive
otherwise. A claim over the four complexity metrics holds when all four hold and fails when all four fail. With
fewer than ``MIN_SEEDS`` seeds in an arm every verdict is ``inconclusive`` (the computed one is kept beside it as
``unpowered``): two seeds agree in sign by chance half the time.

**Against another study** (``study_against``): one setting's effect on the slopes is the difference of two
studies' per-seed slopes, arm by arm (Welch, as above): a learned study against its frozen control (learning's own
share of each slope), or a study with one switch changed against the one without (that switch's share). Seed s of
both studies shares its random numbers at the start (``study_against`` says where), so the difference is also
given paired by seed; the Welch verdict, with the same rule and seed minimum, is the quoted one.

Claims: ``population_minus_single_complexity_slope`` (the primary one: the population's complexity slope exceeds
the single agent's), ``single_complexity_down``, ``population_complexity_up``,
``population_coverage_at_equal_programs_higher`` (it replaces ``population_coverage_per_proposal_higher``, which
failed by construction), ``population_mean_probe_ge_single``, ``weakest_member_probe_ge_single`` (against the
weakest of as many single-agent draws).
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
MEMBER_STATS = ("entropy", "kl_to_base", "update_norm")
"""Learner statistics of each member (``train.<member>.<stat>``) averaged per role into ``<role>_<stat>``."""
RATES = ("valid_rate", "solve_rate", "teacher_reward", "student_reward", "buffer_seed_share", "unsolved_share",
         "idle_student_share", *(f"{role}_{stat}" for stat in MEMBER_STATS for role in ("teacher", "student")))
TRENDED = COMPLEXITY + BUFFER_COMPLEXITY + RATES
PER = 100.0
"""Slopes are reported per this many steps."""


def unsolved_share(row: dict[str, Any]) -> float | None:
    """The share of a step's valid tasks that no rollout solved (rho = 0: ``rho_histogram[0]``), None without any."""
    hist = row.get("rho_histogram") or []
    total = sum(hist)
    return hist[0] / total if total else None


def member_mean(row: dict[str, Any], role: str, stat: str) -> float | None:
    """The mean over ``role``'s members of a statistic of their update in this step (``train.<id>.<stat>``: the
    mean token entropy logged with ``rl.log_entropy``, the KL to the base on the steps of its readout, the update's
    norm); None when no such member reported it (an entropy of 0 counts as not logged). The single agent's one
    member counts under both roles (its statistics span its proposals and its answers)."""
    roles = {m["id"]: m.get("role") for m in row.get("members") or []}
    values = [stats[stat] for member, stats in (row.get("train") or {}).items()
              if stat in stats and (stat != "entropy" or stats[stat]) and (roles.get(member) == role or len(roles) == 1)]
    return fmean(values) if values else None


def with_derived(rows: Rows) -> Rows:
    """``rows`` with ``unsolved_share`` and ``<role>_<stat>`` for each of :data:`MEMBER_STATS` added where defined."""
    out = []
    for row in rows:
        derived = {"unsolved_share": unsolved_share(row),
                   **{f"{role}_{stat}": member_mean(row, role, stat) for stat in MEMBER_STATS
                      for role in ("teacher", "student")}}
        out.append({**row, **{k: v for k, v in derived.items() if v is not None}})
    return out


MIN_SEEDS = 4
"""Seeds per arm below which no verdict is quoted (module docstring)."""


@dataclass(frozen=True)
class SeedSlopes:
    """The per-seed OLS slopes of one metric in one arm, per ``PER`` steps, and their mean's 95 % t interval."""

    per_seed: tuple[float, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.per_seed))

    @property
    def ci(self) -> float:
        """t_{0.975, S-1} sd / sqrt(S); infinite for one seed (no interval)."""
        return mean_ci(self.per_seed)[1] if len(self.per_seed) >= 2 else math.inf

    @property
    def direction(self) -> str:
        """"rises" or "falls" where the interval excludes 0, else "flat"."""
        return {"holds": "rises", "fails": "falls"}.get(verdict(self.mean - self.ci, self.mean + self.ci), "flat")

    def as_dict(self) -> dict[str, Any]:
        ci = round(self.ci, 4) if self.ci < math.inf else None
        return {"slope": round(self.mean, 4), "ci": ci, "per_seed": [round(v, 4) for v in self.per_seed],
                "direction": self.direction}


def seed_slopes(runs: Sequence[Rows], key: str) -> SeedSlopes | None:
    """Each seed's OLS slope of ``key`` on the step (per ``PER`` steps; seeds with under 3 points left out);
    None when no seed has one."""
    per_seed = []
    for rows in runs:
        x, y = series(rows, key)
        if len(x) >= 3 and np.ptp(x) > 0:
            per_seed.append(fit_line(x, y).slope * PER)
    return SeedSlopes(tuple(per_seed)) if per_seed else None


def verdict(lo: float, hi: float) -> str:
    """``holds`` when the interval [lo, hi] of a difference lies above 0, ``fails`` below 0, else ``inconclusive``."""
    if lo > 0:
        return "holds"
    if hi < 0:
        return "fails"
    return "inconclusive"


def all_of(verdicts: Sequence[str]) -> str:
    """One verdict of several claims by the same rule each way: ``holds`` if all hold, ``fails`` if all fail."""
    if verdicts and all(v == "holds" for v in verdicts):
        return "holds"
    if verdicts and all(v == "fails" for v in verdicts):
        return "fails"
    return "inconclusive"


def welch_difference(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """mean(a) - mean(b) with Welch's 95 % interval (module docstring); ``ci`` is its half-width (None when an
    arm has under 2 values), ``df`` the Welch-Satterthwaite degrees of freedom."""
    va, vb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(va.mean() - vb.mean())
    out: dict[str, Any] = {"difference": round(diff, 4), "a": round(float(va.mean()), 4), "b": round(float(vb.mean()), 4),
                           "seeds": [len(va), len(vb)]}
    if len(va) < 2 or len(vb) < 2:
        return {**out, "ci": None, "df": None}
    qa, qb = va.var(ddof=1) / len(va), vb.var(ddof=1) / len(vb)
    se = math.sqrt(qa + qb)
    if se == 0:
        return {**out, "ci": 0.0, "df": len(va) + len(vb) - 2}
    df = (qa + qb) ** 2 / ((qa ** 2 / (len(va) - 1) if qa else 0.0) + (qb ** 2 / (len(vb) - 1) if qb else 0.0))
    dof = max(1, int(math.floor(df)))
    return {**out, "ci": round(t_quantile_975(dof) * se, 4), "df": round(df, 2)}


def difference_verdict(d: dict[str, Any]) -> str:
    """:func:`verdict` of a difference with its half-width ``ci`` (or its bootstrap ``lo``/``hi``)."""
    if "lo" in d:
        return verdict(d["lo"], d["hi"])
    if d.get("ci") is None:
        return "inconclusive"
    return verdict(d["difference"] - d["ci"], d["difference"] + d["ci"])


def paired_probe_difference(population: Sequence[Sequence[Sequence[int]]], single: Sequence[Sequence[Sequence[int]]],
                            samples: int, weakest: bool = False, single_draws: int = 1, replicates: int = 2000,
                            seed: int = 0) -> dict[str, Any]:
    """Probe solve rate, population - single agent, paired by task, with a percentile bootstrap over tasks and seeds.

    ``population[s][m][t]``: correct answers (of ``samples``) of student m of population seed s on task t;
    ``single[s][0][t]`` likewise (a seed's one adapter). A seed's score is the mean over its students of their
    mean rate over the tasks (``weakest``: the lowest student's); an arm's score is its seeds' mean. A replicate
    draws T tasks with replacement (the same draw for both arms: paired) and each arm's seeds with replacement;
    ``lo``/``hi`` are the 2.5 and 97.5 percentiles of the replicates' differences, ``ci`` their half-distance.

    ``single_draws`` = n > 1 matches the weakest member's selection bias: the minimum of n students' measured rates
    lies below their typical rate by the answers' sampling noise alone, so a population of n exact copies of the
    single agent would have its weakest member below the single agent. The single agent's seed score is then the
    minimum over n draws of its answers, each task's count drawn again, Binomial(samples, c_t / samples) from its
    own c_t (a parametric bootstrap of its answers; one draw per task, draw and replicate, indexed by the replicate's
    task draw), and its point score the mean of that minimum over the replicates' draws on every task. Resampling
    from the observed rate understates the answers' variance by (samples - 1) / samples (and removes it with one
    answer a task), so the matched minimum is, if anything, not low enough: the matching does not favour the
    population. It matches answer noise only; the population's students also differ in their adapters, which is
    part of what the claim is about."""
    pop = [np.asarray(seed_scores, dtype=float) / samples for seed_scores in population]
    sin = [np.asarray(seed_scores, dtype=float) / samples for seed_scores in single]
    tasks = {a.shape[1] for a in pop + sin}
    if not pop or not sin or len(tasks) != 1:
        raise ValueError(f"a paired probe comparison needs seeds on both sides answering the same tasks (task counts: {sorted(tasks)})")
    n_tasks = tasks.pop()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_tasks, size=(replicates, n_tasks))

    def arm_score(arm: list[np.ndarray], idx: np.ndarray) -> np.ndarray:
        """[R] scores of an arm's seeds on the task draws idx [R, T] -> [S, R]."""
        per_seed = []
        for a in arm:
            rates = a[:, idx].mean(axis=-1)  # [M, R]
            per_seed.append(rates.min(axis=0) if weakest else rates.mean(axis=0))
        return np.stack(per_seed)

    def matched_score(arm: list[np.ndarray], idx: np.ndarray | None) -> np.ndarray:
        """[S, R]: per seed and replicate the minimum over ``single_draws`` resampled answer sets (docstring);
        ``idx`` None reads every task once."""
        per_seed = []
        for a in arm:
            draws = rng.binomial(samples, a[0], size=(single_draws, replicates, n_tasks)) / samples  # [n, R, T]
            picked = draws if idx is None else np.take_along_axis(draws, idx[None], axis=-1)
            per_seed.append(picked.mean(axis=-1).min(axis=0))
        return np.stack(per_seed)

    full = np.arange(n_tasks)[None, :]
    matched = weakest and single_draws > 1
    pop_point = float(arm_score(pop, full).mean())
    sin_point = float(matched_score(sin, None).mean() if matched else arm_score(sin, full).mean())
    p_scores = arm_score(pop, idx)  # [S, R]
    s_scores = matched_score(sin, idx) if matched else arm_score(sin, idx)
    p_pick = rng.integers(0, len(pop), size=(replicates, len(pop)))
    s_pick = rng.integers(0, len(sin), size=(replicates, len(sin)))
    cols = np.arange(replicates)[:, None]
    diffs = p_scores.T[cols, p_pick].mean(axis=1) - s_scores.T[cols, s_pick].mean(axis=1)
    lo, hi = (float(v) for v in np.percentile(diffs, [2.5, 97.5]))
    return {"difference": round(pop_point - sin_point, 4), "lo": round(lo, 4), "hi": round(hi, 4),
            "ci": round((hi - lo) / 2, 4), "a": round(pop_point, 4), "b": round(sin_point, 4),
            "tasks": n_tasks, "seeds": [len(pop), len(sin)], "replicates": replicates,
            **({"single_draws": single_draws} if matched else {})}


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


def written_in(row: dict[str, Any]) -> int:
    """Programs the teachers wrote at this step (rows from before ``written_programs``: their valid tasks)."""
    return int(row.get("written_programs", row.get("valid_tasks", 0)))


def written_total(rows: Rows) -> int:
    return sum(written_in(r) for r in rows)


def coverage_per_program(rows: Rows) -> float:
    """Distinct AST n-grams of the written programs at the end over the programs written in the run."""
    total = written_total(rows)
    return rows[-1]["coverage"] / total if total else 0.0


def coverage_at(rows: Rows, programs: float) -> float:
    """The run's coverage curve read at ``programs`` written programs: the coverage after the step whose running
    count reached it, interpolated linearly within that step from (count before it, coverage before it), the run
    starting at (0, 0); the end's coverage past the run's last program. (Within a step the programs' order is not
    recorded; coverage is concave in the count, so the chord reads at most one step's curvature low.)"""
    seen, coverage = 0, 0.0
    for row in rows:
        count = written_in(row)
        if seen + count >= programs:
            share = (programs - seen) / count if count else 1.0
            return float(coverage + share * (row["coverage"] - coverage))
        seen, coverage = seen + count, float(row["coverage"])
    return coverage


def coverage_at_equal_programs(population: Sequence[Rows], single: Sequence[Rows]) -> dict[str, Any]:
    """The arms' coverage at an equal number of written programs: every run's coverage curve (:func:`coverage_at`)
    read at C, the fewest programs any run of either arm wrote (so every run reaches it and none is extrapolated),
    then population - single with Welch's interval over the seeds.

    This is what the coverage claim compares: per step or per proposal the population, with twice the teachers,
    writes about twice the programs, and coverage (distinct AST node-type 3-grams of the programs written so far)
    grows concavely in that count, so its coverage per program is lower (and its coverage per step higher) by
    construction. At C both arms have written the same number of programs; what is left is how varied they are."""
    programs = min(written_total(rows) for rows in [*population, *single])
    pop = [coverage_at(rows, programs) for rows in population]
    sin = [coverage_at(rows, programs) for rows in single]
    return {**welch_difference(pop, sin), "programs": programs,
            "per_seed": {"population": [round(v, 2) for v in pop], "single": [round(v, 2) for v in sin]}}


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


def arm_summary(runs: Sequence[Rows], seed_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """Per metric the seeds' slopes (mean and t interval), first/last block means (seed mean), and the arm's
    diagnostics; ``seed_ids``, each run's ``run.seed`` in the order of ``runs``, kept for pairing (:func:`study_against`)."""
    runs = [with_derived(rows) for rows in runs]
    metrics: dict[str, Any] = {}
    for key in TRENDED:
        slopes = seed_slopes(runs, key)
        firsts, lasts = zip(*(block_means(rows, key) for rows in runs))
        first = [v for v in firsts if v is not None]
        last = [v for v in lasts if v is not None]
        metrics[key] = {**(slopes.as_dict() if slopes else {"slope": None, "ci": None, "per_seed": [], "direction": "flat"}),
                        "first": round(fmean(first), 4) if first else None,
                        "last": round(fmean(last), 4) if last else None}
    coverage = [float(rows[-1]["coverage"]) for rows in runs]
    per_program = [coverage_per_program(rows) for rows in runs]
    shares = [s for s in (proposer_token_share(rows) for rows in runs) if s is not None]
    drains = [seed_drain_step(rows) for rows in runs]
    return {
        "seeds": len(runs),
        "seed_ids": list(seed_ids) if seed_ids is not None else None,
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


def slope_verdict(metric: dict[str, Any], sign: int) -> str:
    """The verdict that an arm's slope (``arm_summary``'s metric entry) has ``sign`` (+1 rises, -1 falls)."""
    if metric["ci"] is None:
        return "inconclusive"
    lo, hi = sign * metric["slope"] - metric["ci"], sign * metric["slope"] + metric["ci"]
    return verdict(lo, hi)


def complexity_claims(pop: dict[str, Any], sin: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Per complexity metric the population - single slope difference (Welch, module docstring) and each arm's
    direction; returns (comparisons, verdicts over the four metrics)."""
    interaction: dict[str, Any] = {}
    for key in COMPLEXITY:  # the per-seed slopes arm_summary already fitted
        a, b = pop["metrics"][key]["per_seed"], sin["metrics"][key]["per_seed"]
        d = welch_difference(a, b) if a and b else {"difference": None, "ci": None}
        interaction[key] = {**d, "verdict": difference_verdict(d) if a and b else "inconclusive"}
    verdicts = {
        "population_minus_single_complexity_slope": all_of([interaction[k]["verdict"] for k in COMPLEXITY]),
        "single_complexity_down": all_of([slope_verdict(sin["metrics"][k], -1) for k in COMPLEXITY]),
        "population_complexity_up": all_of([slope_verdict(pop["metrics"][k], +1) for k in COMPLEXITY]),
    }
    per_metric = {k: {"interaction": interaction[k]["verdict"], "single_down": slope_verdict(sin["metrics"][k], -1),
                      "population_up": slope_verdict(pop["metrics"][k], +1)} for k in COMPLEXITY}
    return {"population_minus_single_complexity_slope": interaction, "complexity_verdicts_per_metric": per_metric}, verdicts


def study_summary(population: Sequence[Rows], single: Sequence[Rows], probes: dict[str, Any] | None = None,
                  seed_ids: dict[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """Both arms' summaries, the comparisons and every claim's verdict. ``probes`` (optional):
    ``{"population": [[per-task correct counts per student] per seed], "single": [[counts] per seed],
    "base": [counts], "samples": answers per task}``; ``seed_ids`` (optional): per arm its runs' seeds, in order."""
    seed_ids = seed_ids or {}
    pop, sin = arm_summary(population, seed_ids.get("population")), arm_summary(single, seed_ids.get("single"))
    claims, verdicts = complexity_claims(pop, sin)
    matched = coverage_at_equal_programs(population, single)
    claims["coverage_per_program"] = welch_difference(pop["coverage_per_program"], sin["coverage_per_program"])
    claims["coverage_at_equal_programs"] = matched
    verdicts["population_coverage_at_equal_programs_higher"] = difference_verdict(matched)
    if probes is not None:
        samples = probes["samples"]
        mean_vs = paired_probe_difference(probes["population"], probes["single"], samples)
        weak_vs = paired_probe_difference(probes["population"], probes["single"], samples, weakest=True)
        students = {len(seed_scores) for seed_scores in probes["population"]}
        if len(students) != 1:
            raise ValueError(f"the population's seeds have different numbers of students ({sorted(students)})")
        weak_matched = paired_probe_difference(probes["population"], probes["single"], samples, weakest=True,
                                               single_draws=students.pop())
        claims["probe_population_mean_minus_single"] = mean_vs
        claims["probe_weakest_member_minus_single"] = weak_vs  # against one draw: biased low (kept: docs quote it)
        claims["probe_weakest_member_minus_single_weakest_of_n"] = weak_matched
        claims["probe_base"] = round(float(np.mean(probes["base"])) / samples, 4)
        verdicts["population_mean_probe_ge_single"] = difference_verdict(mean_vs)
        verdicts["weakest_member_probe_ge_single"] = difference_verdict(weak_matched)
    enough = min(len(population), len(single)) >= MIN_SEEDS
    out = {"population": pop, "single": sin, "comparisons": claims, "min_seeds": MIN_SEEDS, "powered": enough,
           "verdicts": verdicts if enough else {k: "inconclusive" for k in verdicts}}
    if not enough:
        out["unpowered"] = verdicts  # what the verdicts would be: not quoted (module docstring)
    return out


def paired_by_seed(this: Sequence[float], this_ids: Sequence[int] | None, other: Sequence[float],
                   other_ids: Sequence[int] | None) -> dict[str, Any] | None:
    """The per-seed differences d_s = this_s - other_s over the seeds both have, their mean with the t interval
    dbar +- t_{0.975, n-1} sd(d) / sqrt(n), a verdict by the same rule (``inconclusive`` under ``MIN_SEEDS`` pairs),
    and the Pearson ``correlation`` of the two studies' per-seed values (var(d) = var_a + var_b - 2 cov: what the
    pairing removes; None under 3 pairs). None where a side has no seed ids or a seed without a value (the values
    cannot be matched to their seeds)."""
    if this_ids is None or other_ids is None or len(this_ids) != len(this) or len(other_ids) != len(other):
        return None
    a, b = dict(zip(this_ids, this)), dict(zip(other_ids, other))
    common = sorted(set(a) & set(b))
    if not common:
        return None
    d = [a[s] - b[s] for s in common]
    mean, half = mean_ci(d)
    va, vb = np.array([a[s] for s in common]), np.array([b[s] for s in common])
    correlation = (round(float(np.corrcoef(va, vb)[0, 1]), 3)
                   if len(common) >= 3 and va.std() > 0 and vb.std() > 0 else None)
    ci = half if len(common) >= 2 else None
    out = {"difference": round(mean, 4), "ci": None if ci is None else round(ci, 4), "seeds": common,
           "correlation": correlation}
    return {**out, "verdict": difference_verdict(out) if len(common) >= MIN_SEEDS else "inconclusive"}


def study_against(this: dict[str, Any], other: dict[str, Any], keys: Sequence[str] = TRENDED) -> dict[str, Any]:
    """Per arm and metric, this study's per-seed slopes minus ``other``'s (two ``study_summary`` results; Welch,
    :func:`welch_difference`) with a verdict each: ``holds`` (this setting raises the slope), ``fails`` (lowers
    it) or ``inconclusive``, and every verdict ``inconclusive`` under ``MIN_SEEDS`` seeds in any of the four arms.
    Beside it, ``paired``: the same difference paired by seed (:func:`paired_by_seed`), where both summaries
    carry their seeds.

    Where the two studies share random numbers, and so what pairing can gain: seed s of either study runs with
    ``run.seed=s``, which seeds the adapters' initialisation, the league's generator (the reference tasks drawn from
    the buffers, the matches) and every generation request (its sampling seed hashes (run.seed, step, phase,
    request index): ``actors.system.System.seed``). A learned run and its frozen control (``rl.train=false
    evolution.enabled=false``) therefore generate step 1 alike (the same adapters, prompts and sampling draws), and
    step 2 from the same prompts (step 1's outcomes fill the buffers and rate the league alike) with adapters one
    update apart; from then on the buffers, the ratings and so the references and matches differ, and the shared
    request seeds only couple the draws of nearly equal distributions, less as the adapters drift. (A study with
    one switch changed shares likewise until the switch first acts.) A slope spans every step, so pairing removes
    little more than the shared start's share of the seed-to-seed spread: the ``correlation`` of the per-seed slopes
    says how much, and with n pairs the paired interval has n - 1 degrees of freedom against Welch's ~2n - 2, so it
    is narrower only where that correlation is clearly positive. The Welch verdict stays the quoted one."""
    out: dict[str, Any] = {}
    for arm in ("population", "single"):
        rows = {}
        for key in keys:
            a, b = this[arm]["metrics"].get(key), other[arm]["metrics"].get(key)
            if not a or not b or not a["per_seed"] or not b["per_seed"]:
                continue
            d = welch_difference(a["per_seed"], b["per_seed"])
            powered = min(len(a["per_seed"]), len(b["per_seed"])) >= MIN_SEEDS
            paired = paired_by_seed(a["per_seed"], this[arm].get("seed_ids"), b["per_seed"], other[arm].get("seed_ids"))
            rows[key] = {**d, "verdict": difference_verdict(d) if powered else "inconclusive", "powered": powered,
                         "paired": paired}
        out[arm] = rows
    return out
