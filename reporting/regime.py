"""Whether a study ran in the paper's regime (the regime rule), per quarter of its steps, from
``proposals.jsonl`` records (``reporting.proposal_records``). Pure: numpy, no Ray.

The paper's second claim needs students that solve most valid tasks: a teacher's reward is -1 invalid, 0 unsolved
and 1 - rho solved, so only pairs of two solved tasks pay for the harder one (``reporting.complexity_payoff``). The
rule, fixed before the study ran: the regime holds in a quarter when

- the **unsolved share** (valid proposals no rollout solved, rho = 0, over valid proposals; every family) is at most
  :data:`MAX_UNSOLVED`, and
- **solved-vs-solved pairs** carry at least :data:`MIN_SOLVED_PAIRS` of the teacher's advantage
  (``complexity_payoff.pair_shares`` with the run's weighting and whitening),

each as the mean over seeds (the seed is the unit; every seed's value is reported beside it), and it holds for the
run when it holds in every quarter.
"""

from __future__ import annotations

from typing import Any, Sequence

from reporting.complexity_payoff import Records, pair_shares, seed_mean_ci, windows_of

MAX_UNSOLVED = 0.25
MIN_SOLVED_PAIRS = 0.4


def unsolved_share(records: Records) -> float | None:
    """Valid proposals whose student solved none of its rollouts (rho = 0) / valid proposals (None: none valid)."""
    valid = [r for r in records if r["valid"]]
    return sum(1 for r in valid if not r.get("rho")) / len(valid) if valid else None


def regime_by_quarter(runs: Sequence[Records], steps: int, weighting: str = "token", whiten: bool = True) -> dict[str, Any]:
    """One arm's regime per quarter of ``steps`` (module docstring): per quarter the seeds' unsolved shares and
    solved-vs-solved shares, their means with 95 % t half-widths, and ``holds``; ``holds`` for all quarters."""
    quarters = []
    for lo, hi in windows_of(steps, 4):
        per_seed = [[r for r in recs if lo <= r["step"] <= hi] for recs in runs]
        unsolved = [unsolved_share(recs) for recs in per_seed]
        shares = [pair_shares(recs, weighting, whiten) for recs in per_seed]
        solved_pairs = [s["solved_vs_solved"] if s else None for s in shares]
        u, p = seed_mean_ci(unsolved), seed_mean_ci(solved_pairs)
        fails = (u["mean"] is not None and u["mean"] > MAX_UNSOLVED) or (p["mean"] is not None and p["mean"] < MIN_SOLVED_PAIRS)
        holds = False if fails else None if u["mean"] is None or p["mean"] is None else True
        quarters.append({"steps": [lo, hi], "unsolved_share": {**u, "per_seed": _rounded(unsolved)},
                         "solved_vs_solved_share": {**p, "per_seed": _rounded(solved_pairs)}, "holds": holds})
    verdicts = [q["holds"] for q in quarters]
    return {"quarters": quarters, "max_unsolved": MAX_UNSOLVED, "min_solved_pairs": MIN_SOLVED_PAIRS,
            "holds": False if False in verdicts else None if not verdicts or None in verdicts else True}


def _rounded(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else round(v, 4) for v in values]
