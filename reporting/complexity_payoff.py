"""What the teacher's reward pays for complexity: the direct test of "simpler pays", from ``proposals.jsonl``
(``reporting.proposal_records``). Pure: numpy, no Ray.

For one run (one seed) and a window of steps:

- **by complexity bin**: the proposals in bins of their program's lines of code (``invalid`` apart: an invalid
  proposal has no program to measure), with the count, the mean reward and the mean advantage of each;
- **payoff slopes**: the OLS slope of the advantage on lines of code over the valid written programs (does a
  longer valid program earn more than a shorter one of the same member's group?), and of the advantage on the
  completion's tokens over every proposal (does writing more pay, once invalidity is counted?);
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

from reporting.report_trends import fit_line, t_quantile_975

Records = list[dict[str, Any]]

LOC_BINS = ((1, 2), (3, 4), (5, 6), (7, 10_000))
"""Lines-of-code bins of valid programs (inclusive)."""
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


def pair_masses(records: Records, weighting: str = "token", whiten: bool = True, eps: float = 1e-6) -> dict[str, float]:
    """Per pair class the advantage mass its pairs move (module docstring), summed over every group of ``records``
    (records without an advantage, i.e. empty completions, are left out as the learner leaves them out)."""
    groups: dict[tuple, Records] = defaultdict(list)
    for r in records:
        if r.get("advantage") is not None:
            groups[(r["step"], r["member"], r["family"])].append(r)
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
    loc = record.get("loc") or 0
    return next((f"{lo}-{hi}" if hi < 10_000 else f"{lo}+" for lo, hi in LOC_BINS if lo <= loc <= hi), "0")


def by_bin(records: Records) -> dict[str, dict[str, float]]:
    """Per lines-of-code bin (``invalid`` apart): ``n``, mean ``reward``, mean ``advantage`` (written programs and
    invalid proposals; a valid code_f task's program is a buffer's, not the teacher's)."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("advantage") is not None and (r["written"] or not r["valid"]):
            out[loc_bin(r)].append(r)
    return {b: {"n": len(rs), "reward": float(np.mean([r["reward"] for r in rs])),
                "advantage": float(np.mean([r["advantage"] for r in rs]))} for b, rs in sorted(out.items())}


def payoff_slopes(records: Records) -> dict[str, float | None]:
    """``advantage_per_line``: OLS slope of the advantage on lines of code over valid written programs;
    ``advantage_per_100_tokens``: of the advantage on completion tokens over every proposal (per 100 tokens)."""
    written = [r for r in records if r.get("advantage") is not None and r["written"]]
    every = [r for r in records if r.get("advantage") is not None]
    out: dict[str, float | None] = {"advantage_per_line": None, "advantage_per_100_tokens": None}
    x = [float(r["loc"]) for r in written]
    if len(x) >= 3 and np.ptp(x) > 0:
        out["advantage_per_line"] = fit_line(x, [r["advantage"] for r in written]).slope
    x = [float(r["completion_tokens"]) for r in every]
    if len(x) >= 3 and np.ptp(x) > 0:
        out["advantage_per_100_tokens"] = 100 * fit_line(x, [r["advantage"] for r in every]).slope
    return out


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
    """One arm: per window of steps, the seed means (with t intervals) of the payoff slopes and the pair shares,
    and the bins' reward and advantage (seed means)."""
    out = []
    for lo, hi in windows_of(steps, windows):
        per_seed = [[r for r in recs if lo <= r["step"] <= hi] for recs in runs]
        slopes = [payoff_slopes(recs) for recs in per_seed]
        shares = [pair_shares(recs, weighting, whiten) for recs in per_seed]
        bins = [by_bin(recs) for recs in per_seed]
        names = sorted({b for seed in bins for b in seed})
        out.append({
            "steps": [lo, hi],
            **{k: seed_mean_ci([s[k] for s in slopes]) for k in ("advantage_per_line", "advantage_per_100_tokens")},
            "pair_shares": {c: seed_mean_ci([s[c] if s else None for s in shares]) for c in PAIR_CLASSES},
            "bins": {b: {"n": int(sum(seed[b]["n"] for seed in bins if b in seed)),
                         "reward": seed_mean_ci([seed[b]["reward"] if b in seed else None for seed in bins])["mean"],
                         "advantage": seed_mean_ci([seed[b]["advantage"] if b in seed else None for seed in bins])["mean"]}
                     for b in names},
        })
    return {"windows": out, "weighting": weighting, "whiten": whiten}
