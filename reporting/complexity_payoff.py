"""What the teacher's reward pays for complexity: the direct test of "simpler pays", from ``proposals.jsonl``
(``reporting.proposal_records``). Pure: numpy, and the learner's own advantage function (``learners.pg_loss``, torch)
for the recomputed advantages rather than a second implementation of it; no Ray.

For one run (one seed) and a window of steps:

- **by complexity bin**: the proposals in bins of their program's lines of code (``invalid`` apart: an invalid
  proposal has no program to measure), with the count, the mean reward, the mean advantage trained with and the
  mean advantage with sequence weights of each;
- **payoff slopes**: the OLS slope of the advantage on lines of code over the valid written programs (does a
  longer valid program earn more than a shorter one of the same member's group?), and of the advantage on the
  completion's tokens over every proposal (does writing more pay, once invalidity is counted?);
- **the same slope without the arithmetic of token weights** (``advantage_per_line_sequence``): with token weights
  (w_i = n_i) a valid program's advantage against the same partners shrinks as its own completion grows (in a
  group of two, A_1 = (n_2 / (n_1 + n_2)) (r_1 - r_2) centred, sign(r_1 - r_2) sqrt(n_2 / n_1) whitened), and a
  valid program's partners are on average worse (the invalid ones earn -1), so the trained-with
  ``advantage_per_line`` falls with length even when the reward does not depend on it. Recomputed from the
  records' rewards with every weight 1 (A_i = r_i - mean_g r, over the group's std when the run whitened), the
  advantage is a function of the group's rewards alone, so its slope on lines of code is ~0 unless the reward
  itself depends on length; ``reward_per_line``, the OLS slope of the raw reward on lines of code, says whether it
  does (before any group baseline);
- **the students' solve rate by program size**: per bin of lines of code and of AST depth, per family and pooled,
  the mean rho of the valid tasks and their count (``reporting.structural_difficulty``): whether bigger programs are
  harder for the students, the precondition of a reward that pays for them;
- **pair shares**: where the teacher's advantage comes from. Within a group (step, member, family) with weights
  w_i (tokens or 1, ``rl.advantage_weighting``), W = sum w, the centred advantage is a sum over pairs:

      A_i = r_i - sum_j w_j r_j / W = sum_j (w_j / W) (r_i - r_j),

  so the pair (i, j) moves (w_i + w_j) |r_i - r_j| / W of advantage between i and j (divided by the group's
  std when whitened). Each pair is classed by its two proposals: ``invalid_vs_valid``, ``unsolved_vs_solved``
  (both valid, one with rho = 0), ``solved_vs_solved`` (both rho > 0: the only pairs in which the harder task
  earns more) and ``same_class`` (two invalid or two unsolved: no gap under the paper's rewards). A share is the
  class's pair mass over all pairs' mass.

Across seeds (``payoff_summary``) each number is a seed mean with its 95 % t interval (the seed is the unit).
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import combinations
from typing import Any, Sequence

import numpy as np

from learners.pg_loss import group_normalised_advantages
from reporting.report_trends import fit_line, t_quantile_975
from reporting.structural_difficulty import BINS, LOC_BINS, bin_label, labels, solve_by_bin

Records = list[dict[str, Any]]

PAIR_CLASSES = ("invalid_vs_valid", "unsolved_vs_solved", "solved_vs_solved", "same_class")


def outcome(record: dict[str, Any]) -> str:
    """``invalid``, ``unsolved`` (valid, rho = 0) or ``solved`` (rho > 0)."""
    if not record["valid"]:
        return "invalid"
    return "solved" if (record.get("rho") or 0) > 0 else "unsolved"


def pair_class(a: dict[str, Any], b: dict[str, Any]) -> str:
    kinds = {outcome(a), outcome(b)}
    if len(kinds) == 1:
        return "solved_vs_solved" if kinds == {"solved"} else "same_class"
    return "invalid_vs_valid" if "invalid" in kinds else "unsolved_vs_solved"


def group_key(record: dict[str, Any]) -> tuple:
    """The learner's advantage group of a teacher's proposal: (step, member, family); the role is the teacher's for
    every record (``reporting.proposal_records``)."""
    return record["step"], record["member"], record["family"]


def trained(records: Records) -> Records:
    """The records the learner trained on: those with an advantage (an empty completion has none)."""
    return [r for r in records if r.get("advantage") is not None]


def sequence_advantages(records: Records, whiten: bool) -> list[float]:
    """Each of ``trained(records)``'s advantage recomputed with sequence weights, A_i = (r_i - mu_g) [/ sqrt(var_g +
    eps) when ``whiten``], mu_g and var_g the unweighted mean and variance of its group's rewards: the learner's own
    function (``learners.pg_loss.group_normalised_advantages``, ``weighting="sequence"``) over the learner's groups
    (:func:`group_key`). In the order of ``trained(records)``."""
    kept = trained(records)
    if not kept:
        return []
    return group_normalised_advantages([float(r["reward"]) for r in kept], [group_key(r) for r in kept],
                                       [int(r["completion_tokens"]) for r in kept], whiten=whiten,
                                       weighting="sequence").tolist()


def with_sequence_advantages(records: Records, whiten: bool) -> Records:
    """``trained(records)``, each a copy with ``advantage_sequence`` (:func:`sequence_advantages`) added."""
    return [{**r, "advantage_sequence": a} for r, a in zip(trained(records), sequence_advantages(records, whiten))]


def pair_masses(records: Records, weighting: str = "token", whiten: bool = True, eps: float = 1e-6) -> dict[str, float]:
    """Per pair class the advantage mass its pairs move (module docstring), summed over every group of ``records``
    (records without an advantage, i.e. empty completions, are left out as the learner leaves them out)."""
    groups: dict[tuple, Records] = defaultdict(list)
    for r in trained(records):
        groups[group_key(r)].append(r)
    mass = {c: 0.0 for c in PAIR_CLASSES}
    for group in groups.values():
        w = np.array([float(r["completion_tokens"]) if weighting == "token" else 1.0 for r in group])
        rewards = np.array([float(r["reward"]) for r in group])
        total = w.sum()
        mean = (w * rewards).sum() / total
        var = (w * (rewards - mean) ** 2).sum() / total
        if var <= 0:
            continue
        scale = math.sqrt(var + eps) if whiten else 1.0
        for i, j in combinations(range(len(group)), 2):
            mass[pair_class(group[i], group[j])] += (w[i] + w[j]) * abs(rewards[i] - rewards[j]) / total / scale
    return mass


def pair_shares(records: Records, weighting: str = "token", whiten: bool = True) -> dict[str, float] | None:
    """:func:`pair_masses` as shares of their total (None when no group had a reward gap)."""
    mass = pair_masses(records, weighting, whiten)
    total = sum(mass.values())
    return {c: m / total for c, m in mass.items()} if total > 0 else None


def loc_bin(record: dict[str, Any]) -> str:
    if not record["valid"]:
        return "invalid"
    return bin_label(record.get("loc") or 0, LOC_BINS) or "0"


def by_bin(records: Records) -> dict[str, dict[str, float]]:
    """Per lines-of-code bin (``invalid`` apart): ``n``, mean ``reward``, mean ``advantage`` (written programs and
    invalid proposals; a valid code_f task's program is a buffer's, not the teacher's), and the mean
    ``advantage_sequence`` where the records carry it (:func:`with_sequence_advantages`)."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in trained(records):
        if r["written"] or not r["valid"]:
            out[loc_bin(r)].append(r)
    return {b: {"n": len(rs), "reward": float(np.mean([r["reward"] for r in rs])),
                "advantage": float(np.mean([r["advantage"] for r in rs])),
                **({"advantage_sequence": float(np.mean([r["advantage_sequence"] for r in rs]))}
                   if all("advantage_sequence" in r for r in rs) else {})}
            for b, rs in sorted(out.items())}


SLOPES = ("advantage_per_line", "advantage_per_line_sequence", "reward_per_line", "advantage_per_100_tokens")


def payoff_slopes(records: Records) -> dict[str, float | None]:
    """OLS slopes over the valid written programs, on their lines of code: ``advantage_per_line`` of the advantage
    trained with, ``advantage_per_line_sequence`` of the advantage with sequence weights (where the records carry
    it: :func:`with_sequence_advantages`), ``reward_per_line`` of the raw reward; and ``advantage_per_100_tokens``,
    of the advantage trained with on completion tokens over every proposal (per 100 tokens)."""
    written = [r for r in trained(records) if r["written"]]
    every = trained(records)
    out: dict[str, float | None] = dict.fromkeys(SLOPES)
    x = [float(r["loc"]) for r in written]
    if len(x) >= 3 and np.ptp(x) > 0:
        out["advantage_per_line"] = fit_line(x, [r["advantage"] for r in written]).slope
        out["reward_per_line"] = fit_line(x, [r["reward"] for r in written]).slope
        if all("advantage_sequence" in r for r in written):
            out["advantage_per_line_sequence"] = fit_line(x, [r["advantage_sequence"] for r in written]).slope
    x = [float(r["completion_tokens"]) for r in every]
    if len(x) >= 3 and np.ptp(x) > 0:
        out["advantage_per_100_tokens"] = 100 * fit_line(x, [r["advantage"] for r in every]).slope
    return out


def students_solve_by_bin(records: Records) -> dict[str, Any]:
    """The students' solve rate (mean rho) and count of valid tasks per bin of the task's program, by lines of code
    and by AST depth, per family and pooled (``reporting.structural_difficulty.solve_by_bin``); a code_f task's
    program is the buffer program the student must infer, so every valid task counts."""
    valid = [r for r in records if r["valid"] and r.get("rho") is not None and r.get("loc") is not None]
    return {"loc": solve_by_bin(valid, "loc"), "ast_depth": solve_by_bin(valid, "ast_depth")}


def windows_of(steps: int, count: int = 4) -> list[tuple[int, int]]:
    """``count`` windows of consecutive steps (inclusive) covering 1..steps."""
    edges = [round(i * steps / count) for i in range(count + 1)]
    return [(edges[i] + 1, edges[i + 1]) for i in range(count) if edges[i + 1] > edges[i]]


def seed_mean_ci(values: Sequence[float | None]) -> dict[str, Any]:
    """The mean of the seeds' values (None left out) with its 95 % t half-width (None under 2 seeds)."""
    v = np.array([x for x in values if x is not None], dtype=float)
    if len(v) == 0:
        return {"mean": None, "ci": None, "seeds": 0}
    ci = t_quantile_975(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v)) if len(v) >= 2 else None
    return {"mean": round(float(v.mean()), 4), "ci": None if ci is None else round(ci, 4), "seeds": len(v)}


def payoff_summary(runs: Sequence[Records], steps: int, weighting: str = "token", whiten: bool = True,
                   windows: int = 4) -> dict[str, Any]:
    """One arm: per window of steps, the seed means (with t intervals) of the payoff slopes (:data:`SLOPES`) and the
    pair shares, and the bins' reward and advantages (seed means). The sequence-weighted advantages keep the runs'
    own normalisation (``whiten``), so they differ from the trained-with ones by the weights alone."""
    runs = [with_sequence_advantages(recs, whiten) for recs in runs]
    out = []
    for lo, hi in windows_of(steps, windows):
        per_seed = [[r for r in recs if lo <= r["step"] <= hi] for recs in runs]
        slopes = [payoff_slopes(recs) for recs in per_seed]
        shares = [pair_shares(recs, weighting, whiten) for recs in per_seed]
        bins = [by_bin(recs) for recs in per_seed]
        names = sorted({b for seed in bins for b in seed})
        solve = [students_solve_by_bin(recs) for recs in per_seed]
        out.append({
            "steps": [lo, hi],
            **{k: seed_mean_ci([s[k] for s in slopes]) for k in SLOPES},
            "pair_shares": {c: seed_mean_ci([s[c] if s else None for s in shares]) for c in PAIR_CLASSES},
            "bins": {b: {"n": int(sum(seed[b]["n"] for seed in bins if b in seed)),
                         **{k: seed_mean_ci([seed[b].get(k) if b in seed else None for seed in bins])["mean"]
                            for k in ("reward", "advantage", "advantage_sequence")}}
                     for b in names},
            "solve_by_bin": {metric: {family: {b: {"n": int(sum(seed[metric].get(family, {}).get(b, {}).get("n", 0)
                                                                  for seed in solve)),
                                                   "solve": seed_mean_ci([seed[metric].get(family, {}).get(b, {}).get("solve")
                                                                          for seed in solve])["mean"]}
                                               for b in labels(BINS[metric])}
                                      for family in sorted({f for seed in solve for f in seed[metric]})}
                             for metric in BINS},
        })
    return {"windows": out, "weighting": weighting, "whiten": whiten}
