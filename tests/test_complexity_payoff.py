"""The reward-for-complexity diagnostic (``reporting.complexity_payoff``) on hand-checkable numbers, and the
per-proposal records it reads (``reporting.proposal_records``): their advantages are the learner's own."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from configs.schema import RLConfig
from learners.data_parallel import step_targets
from learners.pg_loss import group_normalised_advantages
from reporting.complexity_payoff import (
    SLOPES,
    by_bin,
    pair_masses,
    pair_shares,
    payoff_slopes,
    payoff_summary,
    windows_of,
    with_sequence_advantages,
)
from reporting.proposal_records import proposal_records
from reporting.report_trends import fit_line
from rollouts import Sample, learner_samples
from verifier.tasks import Task


def record(valid: bool, rho: float | None, reward: float, tokens: int, loc: int = 3, step: int = 1,
           family: str = "code_o", member: str = "t0", advantage: float = 0.0) -> dict:
    return {"step": step, "member": member, "family": family, "valid": valid, "rho": rho, "reward": reward,
            "completion_tokens": tokens, "written": valid and family != "code_f", "loc": loc if valid else None,
            "ast_depth": 4 + loc if valid else None, "advantage": advantage}


GROUP = [record(False, None, -1.0, 20), record(True, 0.0, 0.0, 40), record(True, 0.25, 0.75, 40), record(True, 0.5, 0.5, 20)]


def test_pair_masses_split_the_centred_advantage_by_pair_class():
    # Sequence weights, centred: every pair moves (1 + 1) / 4 |r_i - r_j| of advantage.
    mass = pair_masses(GROUP, weighting="sequence", whiten=False)
    assert mass["invalid_vs_valid"] == pytest.approx(0.5 * (1 + 1.75 + 1.5))
    assert mass["unsolved_vs_solved"] == pytest.approx(0.5 * (0.75 + 0.5))
    assert mass["solved_vs_solved"] == pytest.approx(0.5 * 0.25)
    assert mass["same_class"] == 0
    shares = pair_shares(GROUP, weighting="sequence", whiten=False)
    assert sum(shares.values()) == pytest.approx(1.0) and shares["invalid_vs_valid"] == pytest.approx(4.25 / 5.75)
    # Token weights: the pair (i, j) moves (n_i + n_j) / sum n of it; whitening divides a group by one std.
    token = pair_masses(GROUP, weighting="token", whiten=False)
    assert token["solved_vs_solved"] == pytest.approx((40 + 20) / 120 * 0.25)
    whitened = pair_shares(GROUP, weighting="token", whiten=True)
    assert whitened == pytest.approx(pair_shares(GROUP, weighting="token", whiten=False))
    assert pair_shares([record(True, 0.0, 0.0, 5)] * 2) is None  # no reward gap, no advantage


def test_bins_slopes_and_windows():
    recs = [record(True, 0.5, 0.5, 10 * loc, loc=loc, step=s, advantage=0.1 * loc) for s in (1, 2) for loc in range(1, 9)]
    recs.append(record(False, None, -1.0, 100, step=1, advantage=-1.0))
    slopes = payoff_slopes(recs)
    assert slopes["advantage_per_line"] == pytest.approx(0.1)
    bins = by_bin(recs)
    assert bins["invalid"] == {"n": 1, "reward": -1.0, "advantage": -1.0}
    assert bins["7+"]["n"] == 4 and bins["1-2"]["advantage"] == pytest.approx(0.15)
    assert windows_of(100, 4) == [(1, 25), (26, 50), (51, 75), (76, 100)]
    summary = payoff_summary([recs, recs], steps=2, windows=1)
    window = summary["windows"][0]
    assert window["advantage_per_line"]["mean"] == pytest.approx(0.1) and window["advantage_per_line"]["ci"] == 0
    assert set(SLOPES) <= set(window) and window["reward_per_line"]["mean"] == 0  # every valid reward 0.5
    assert window["bins"]["invalid"]["reward"] == -1.0 and "advantage_sequence" in window["bins"]["3-4"]


def test_the_students_solve_rate_by_program_size_per_window_is_the_seed_mean_per_bin():
    """Two seeds: short programs solved 1.0 and 0.5 (seed mean 0.75), 7+ lines 0.0 and 0.5 (0.25); code_f tasks count
    (their program is the buffer's the student must infer); invalid proposals do not."""
    def seed(short_rho: float, long_rho: float) -> list[dict]:
        return ([record(True, short_rho, 0.0, 10, loc=2, step=1), record(True, long_rho, 0.0, 10, loc=8, step=1),
                 record(True, short_rho, 0.0, 10, loc=1, step=2, family="code_f"), record(False, None, -1.0, 10, step=2)])
    window = payoff_summary([seed(1.0, 0.0), seed(0.5, 0.5)], steps=2, windows=1)["windows"][0]
    loc = window["solve_by_bin"]["loc"]
    assert loc["pooled"]["1-2"] == {"n": 4, "solve": 0.75} and loc["pooled"]["7+"] == {"n": 2, "solve": 0.25}
    assert loc["pooled"]["3-4"] == {"n": 0, "solve": None} and loc["code_f"]["1-2"] == {"n": 2, "solve": 0.75}
    depth = window["solve_by_bin"]["ast_depth"]["pooled"]  # depth 4 + loc: 6 (loc 2), 5 (loc 1), 8+ (loc 8)
    assert depth["1-5"]["n"] == 2 and depth["6"] == {"n": 2, "solve": 0.75} and depth["8+"]["solve"] == 0.25


def test_sequence_advantages_are_the_unweighted_group_baseline():
    """A_i = r_i - mean_g r with every weight 1 (centred), over the group's population std when whitened."""
    rewards = [r["reward"] for r in GROUP]
    centred = [r["advantage_sequence"] for r in with_sequence_advantages(GROUP, whiten=False)]
    assert centred == pytest.approx([x - np.mean(rewards) for x in rewards], abs=1e-6)
    whitened = [r["advantage_sequence"] for r in with_sequence_advantages(GROUP, whiten=True)]
    assert whitened == pytest.approx(list(np.array(centred) / np.sqrt(np.var(rewards) + 1e-6)), abs=1e-5)
    other = [{**r, "member": "t1"} for r in GROUP[:2]]  # another member's group: its own baseline
    assert [r["advantage_sequence"] for r in with_sequence_advantages(other, whiten=False)] == pytest.approx([-0.5, 0.5])
    no_completion = {**GROUP[0], "advantage": None}  # left out, as the learner leaves it out
    assert len(with_sequence_advantages([no_completion, *GROUP[1:]], whiten=False)) == 3


def synthetic_groups(groups: int, reward_per_line: float, whiten: bool, seed: int = 0) -> list[dict]:
    """Groups of two proposals (one member, one family, one step each, as at ``tasks_per_teacher: 6``): 0.7 valid,
    a valid one's tokens growing with its lines of code (1-10), its reward drawn from {0, 0.25, 0.5, 0.75} plus
    ``reward_per_line`` per line; invalid ones -1. ``advantage`` is the learner's, token-weighted."""
    rng = np.random.default_rng(seed)
    recs = []
    for g in range(groups):
        for _ in range(2):
            loc, valid = int(rng.integers(1, 11)), bool(rng.random() < 0.7)
            tokens = int(30 + 10 * loc + rng.integers(0, 20)) if valid else int(rng.integers(40, 160))
            reward = float(np.clip(rng.choice([0.0, 0.25, 0.5, 0.75]) + reward_per_line * (loc - 5.5), 0, 1)) if valid else -1.0
            recs.append(record(valid, 0.5 if valid else None, reward, tokens, loc=loc, step=g + 1))
    trained = group_normalised_advantages([r["reward"] for r in recs], [r["step"] for r in recs],
                                          [r["completion_tokens"] for r in recs], whiten=whiten, weighting="token")
    return [{**r, "advantage": a} for r, a in zip(recs, trained.tolist())]


def slope_and_se(recs: list[dict], key: str) -> tuple[float, float]:
    written = [r for r in recs if r["written"]]
    fit = fit_line([r["loc"] for r in written], [r[key] for r in written])
    return fit.slope, fit.slope_ci / fit.t


@pytest.mark.parametrize("whiten", [False, True])
def test_a_length_independent_reward_pays_nothing_per_line_with_sequence_weights(whiten):
    """The arithmetic bias: 3,000 groups of two whose reward ignores length. The token-weighted advantage the learner
    trains with falls with lines of code (a longer valid program takes a smaller share of its gap to a partner, who
    is more often invalid); with sequence weights the slope is within 3 standard errors of 0 (~4,200 valid programs: a
    standard error of ~0.002 centred, ~0.005 whitened: a true 0 lies inside 3 of them 997 times in 1,000)."""
    recs = with_sequence_advantages(synthetic_groups(3000, 0.0, whiten), whiten)
    slopes = payoff_slopes(recs)
    trained, trained_se = slope_and_se(recs, "advantage")
    sequence, sequence_se = slope_and_se(recs, "advantage_sequence")
    assert slopes["advantage_per_line"] == pytest.approx(trained) and slopes["advantage_per_line_sequence"] == pytest.approx(sequence)
    assert trained < -3 * trained_se  # the bias the sequence weights remove
    assert abs(sequence) < 3 * sequence_se
    assert abs(slopes["reward_per_line"]) < 3 * slope_and_se(recs, "reward")[1]


@pytest.mark.parametrize("whiten", [False, True])
def test_a_reward_that_grows_with_length_shows_in_the_sequence_weighted_slope(whiten):
    """+0.03 reward per line: the sequence-weighted slope is positive (so the test above can fail), while the
    token-weighted one hides most of it."""
    recs = with_sequence_advantages(synthetic_groups(3000, 0.03, whiten), whiten)
    slopes = payoff_slopes(recs)
    sequence, sequence_se = slope_and_se(recs, "advantage_sequence")
    assert sequence > 3 * sequence_se and slopes["reward_per_line"] > 0.02
    assert slopes["advantage_per_line"] < sequence


@dataclass
class Generation:
    token_ids: list
    prompt_token_ids: list = field(default_factory=lambda: [1, 2])
    logprobs: list = field(default_factory=list)
    adapter_version: int = 0


@dataclass
class Job:
    teacher: str
    family: str
    student: str = "s0"


@dataclass
class Verdict:
    valid: bool
    task: Task | None = None
    reason: str = ""


@pytest.mark.parametrize("weighting, norm", [("token", "whiten"), ("sequence", "center")])
def test_records_carry_the_advantage_the_learner_trains_with(weighting, norm):
    rl = RLConfig(advantage_weighting=weighting, advantage_norm=norm)
    program = "def f(a):\n    b = a + 1\n    return b"
    jobs = [Job("t0", "code_o"), Job("t0", "code_o"), Job("t0", "code_i"), Job("t1", "code_o"), Job("t1", "code_o")]
    verdicts = [Verdict(True, Task("code_o", program, ["1"], ["2"])), Verdict(False, reason="no f"),
                Verdict(True, Task("code_i", program, ["1"], ["2"])), Verdict(True, Task("code_o", program, ["3"], ["4"])),
                Verdict(True, Task("code_o", program, ["5"], ["6"]))]
    rho = [0.5, None, 0.0, 1.0, 0.25]
    rewards = [0.5, -1.0, 0.0, 0.0, 0.75]
    lengths = [30, 12, 20, 50, 25]
    samples = [Sample(j.teacher, "teacher", j.family, [1, 2], [7] * n, [], r) for j, n, r in zip(jobs, lengths, rewards)]
    samples.append(Sample("s0", "student", "code_o", [1], [5] * 9, [], 1.0, task=0))
    records = proposal_records(jobs, verdicts, rho, samples, rl)
    assert [r["valid"] for r in records] == [True, False, True, True, True]
    assert records[1]["reason"] == "no f" and records[1]["loc"] is None and records[0]["loc"] == 3
    assert records[2]["written"] and records[0]["completion_tokens"] == 30
    batch, _ = learner_samples(samples, {"t0": 0, "t1": 1, "s0": 2}, {}, rl.advantage_baseline, "off")
    targets = step_targets(batch, whiten=norm == "whiten", weighting=weighting)
    assert [r["advantage"] for r in records] == pytest.approx(targets.advantages[:5].tolist(), abs=1e-6)
    with pytest.raises(ValueError, match="teacher samples"):
        proposal_records(jobs[:4], verdicts[:4], rho[:4], samples, rl)
