"""The pure glue of a step: proposal prompts from references, rho per proposal, rewards per completion."""

from __future__ import annotations

import pytest

from actors.engines.requests import Generation
from actors.rollouts import (
    ProposalJob,
    Sample,
    SolveJob,
    advantage_group,
    proposal_jobs,
    reference_counts,
    solve_rates,
    student_samples,
    teacher_samples,
)
from configs.schema import RewardsConfig
from learners.pg_loss import group_normalised_advantages
from verifier.families import Judgement
from verifier.tasks import identity_task


def generation(member: str) -> Generation:
    return Generation(text="x", token_ids=[5, 6], logprobs=[-0.1, -0.2], adapter=member, adapter_version=3,
                      finish_reason="stop", prompt_token_ids=[1, 2, 3])


def test_proposal_jobs_rotate_families_and_consume_references():
    pairs = [("t0", "s1"), ("t1", "s0")]
    families = ["code_o", "code_i", "code_f"]
    counts = reference_counts(pairs, families, 4)
    assert counts == {"code_o": 4, "code_i": 2, "code_f": 2}
    refs = {f: [[identity_task(f if f != "code_f" else "code_o")] for _ in range(n)] for f, n in counts.items()}
    jobs = proposal_jobs(pairs, families, 4, refs, n_inputs=4)
    assert [(j.teacher, j.student, j.family) for j in jobs[:4]] == [
        ("t0", "s1", "code_o"), ("t0", "s1", "code_i"), ("t0", "s1", "code_f"), ("t0", "s1", "code_o")]
    assert jobs[2].reference_program == identity_task("code_o").program
    assert all(j.prompt.startswith("User: ") for j in jobs)


def test_rho_and_rewards_population_and_single_agent():
    jobs = [ProposalJob("t0", "s0", "code_o", "p", generation=generation("t0")) for _ in range(4)]
    task = identity_task("code_o")
    solves = [SolveJob(task, i, "s0", "q", [generation("s0"), generation("s0")]) for i in (1, 2, 3)]
    verdicts = [
        [Judgement(True, False), Judgement(True, False)],   # rho 0
        [Judgement(True, True), Judgement(False, False)],   # rho 0.5 (one malformed)
        [Judgement(True, True), Judgement(True, True)],     # rho 1
    ]
    rho = solve_rates(4, solves, verdicts)
    assert rho == [None, 0.0, 0.5, 1.0]
    rewards = RewardsConfig()
    assert [s.reward for s in teacher_samples(jobs, rho, rewards, single_agent=False)] == [-1.0, 0.0, 0.5, 0.0]
    assert [s.reward for s in teacher_samples(jobs, rho, rewards, single_agent=True)] == [-1.0, 0.0, 0.5, 0.0]
    rho_mid = [None, 0.0, 0.25, 1.0]
    assert [s.reward for s in teacher_samples(jobs, rho_mid, rewards, single_agent=False)] == [-1.0, 0.0, 0.75, 0.0]
    students = student_samples(solves, verdicts, rewards)
    assert [s.reward for s in students] == [-0.5, -0.5, 1.0, -1.0, 1.0, 1.0]
    assert all(s.prompt_ids == [1, 2, 3] and s.adapter_version == 3 and s.role == "student" for s in students)
    assert [s.task for s in students] == [s.proposal for s in solves for _ in range(2)]


def test_advantage_groups_per_family_or_per_task():
    """'task' compares a task's rollouts with each other: a task all rollouts solve carries no signal,
    where the family-wide whitening would reward every one of them."""
    rollouts = [Sample("s0", "student", "code_o", [1], [5], [-0.1], r, task=t) for t, r in ((0, 1.0), (0, 1.0), (1, 1.0), (1, -0.5))]
    proposer = Sample("t0", "teacher", "code_o", [1], [5], [-0.1], 0.5)
    assert {advantage_group(s, "family") for s in rollouts} == {("student", "code_o")}
    assert [advantage_group(s, "task") for s in rollouts] == [("student", "code_o", 0)] * 2 + [("student", "code_o", 1)] * 2
    assert advantage_group(proposer, "task") == ("teacher", "code_o")
    with pytest.raises(ValueError, match="baseline"):
        advantage_group(proposer, "prompt")
    rewards = [s.reward for s in rollouts]
    per_task = group_normalised_advantages(rewards, [advantage_group(s, "task") for s in rollouts], [1] * 4)
    per_family = group_normalised_advantages(rewards, [advantage_group(s, "family") for s in rollouts], [1] * 4)
    assert per_task[:2].tolist() == [0.0, 0.0] and per_task[2] > 0 > per_task[3]
    assert per_family[0] > 0 and per_family[1] > 0
