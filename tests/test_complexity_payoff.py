"""The reward-for-complexity diagnostic (``reporting.complexity_payoff``) on hand-checkable numbers, and the
per-proposal records it reads (``reporting.proposal_records``): their advantages are the learner's own."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from configs.schema import RLConfig
from learners.data_parallel import step_targets
from reporting.complexity_payoff import by_bin, pair_masses, pair_shares, payoff_slopes, payoff_summary, windows_of
from reporting.proposal_records import proposal_records
from rollouts import Sample, learner_samples
from verifier.tasks import Task


def record(valid: bool, rho: float | None, reward: float, tokens: int, loc: int = 3, step: int = 1,
           family: str = "code_o", member: str = "t0", advantage: float = 0.0) -> dict:
    return {"step": step, "member": member, "family": family, "valid": valid, "rho": rho, "reward": reward,
            "completion_tokens": tokens, "written": valid and family != "code_f", "loc": loc if valid else None,
            "advantage": advantage}


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
