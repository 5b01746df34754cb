"""The regime rule of the dynamics study in the paper's regime (``reporting.regime``): unsolved share and solved-vs-solved advantage share
per quarter, seed means against the bounds fixed before the study."""

from __future__ import annotations

import pytest

from reporting.regime import regime_by_quarter, unsolved_share


def record(step: int, member: str, rho: float | None, tokens: int = 40) -> dict:
    valid = rho is not None
    reward = -1.0 if not valid else (0.0 if rho == 0 else 1.0 - rho)
    return {"step": step, "member": member, "family": "code_o", "valid": valid, "rho": rho, "reward": reward,
            "completion_tokens": tokens, "advantage": 0.0, "written": valid}


def run(steps: int, rhos: list[float | None]) -> list[dict]:
    """Every step: one teacher's group of the given proposals."""
    return [record(s, "t0", rho, 30 + 10 * i) for s in range(1, steps + 1) for i, rho in enumerate(rhos)]


def test_unsolved_share_counts_valid_tasks_no_rollout_solved():
    assert unsolved_share([record(1, "t", None), record(1, "t", 0.0), record(1, "t", 0.5), record(1, "t", 1.0)]) == pytest.approx(1 / 3)
    assert unsolved_share([record(1, "t", None)]) is None


def test_the_regime_holds_with_solved_tasks_of_different_difficulty_and_fails_with_unsolved_ones():
    strong = [run(8, [0.25, 0.5, 0.75, 1.0, 0.5, 0.25]) for _ in range(4)]
    result = regime_by_quarter(strong, 8)
    assert result["holds"] is True and len(result["quarters"]) == 4
    assert all(q["unsolved_share"]["mean"] == 0 and q["solved_vs_solved_share"]["mean"] >= 0.4 for q in result["quarters"])

    weak = [run(8, [0.0, 0.0, 0.5, 0.0, 0.25, None]) for _ in range(4)]  # 3 of 5 valid unsolved
    result = regime_by_quarter(weak, 8)
    assert result["holds"] is False
    assert result["quarters"][0]["unsolved_share"]["mean"] == pytest.approx(0.6)


def test_one_failing_quarter_fails_the_run():
    seeds = [run(8, [0.25, 0.5, 0.75, 1.0]) for _ in range(4)]
    for recs in seeds:  # the last quarter: every valid task unsolved
        for r in recs:
            if r["step"] > 6:
                r.update(rho=0.0, reward=0.0)
    result = regime_by_quarter(seeds, 8)
    assert [q["holds"] for q in result["quarters"]] == [True, True, True, False] and result["holds"] is False
