"""What one step does with text: prompts in, rewards and training samples out (pure, no Ray).

The loop (``actors.loop``) calls these between the actor calls:

- :func:`proposal_jobs`: every matched teacher gets ``tasks_per_teacher`` proposal prompts, families
  in rotation, each conditioned on K reference tasks from the buffers.
- :func:`solve_jobs`: every valid task becomes a student prompt for the teacher's matched student.
- :func:`solve_rates`: rho per proposal, the solved fraction of its student's rollouts.
- :func:`teacher_samples` / :func:`student_samples`: DESIGN.md's rewards on each completion; teacher
  -1 invalid, 0 when rho = 0, else 1 - rho (single agent: AZR's learnability, 1 - rho for
  0 < rho < 1, else 0); student correct / wrong / malformed.
- :class:`Sample`: one completion with its reward, for the learner of its member.
- :func:`advantage_group`: the key its reward is whitened within (``rl.advantage_baseline``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from configs.schema import RewardsConfig
from verifier.prompts import parse_proposal, student_prompt, teacher_prompt
from verifier.rewards import learnability_reward, student_reward, teacher_reward
from verifier.tasks import Task


@dataclass
class Sample:
    """One sampled completion of ``member`` acting as ``role`` on a ``family`` task, with its reward.

    ``logprobs`` are the behaviour policy's log pi(token | prefix) (temperature 1), as the engine
    returned them; the learner's ratio pi_new / pi_old uses them.
    """

    member: str
    role: str
    family: str
    prompt_ids: list[int]  # exactly how the engine tokenized the prompt
    completion_ids: list[int]
    logprobs: list[float]
    reward: float
    adapter_version: int | None = None
    task: int | None = None  # students: the index of the proposal this rollout answers, within its step


@dataclass
class ProposalJob:
    teacher: str
    student: str
    family: str
    prompt: str
    reference_program: str | None = None  # code_f: the program the teacher writes inputs for
    text: str = ""
    generation: Any = None


@dataclass
class SolveJob:
    task: Task
    proposal: int  # index of the ProposalJob
    student: str
    prompt: str
    generations: list[Any] = field(default_factory=list)


def advantage_group(sample: Sample, baseline: str) -> tuple:
    """The whitening group of ``sample`` besides its member: ``(role, family)`` (AZR's Task-Relative
    REINFORCE++), or with ``baseline == "task"`` a student rollout's ``(role, family, task)``, so each
    task's rollouts are compared with each other only (GRPO's per-prompt baseline)."""
    if baseline not in ("family", "task"):
        raise ValueError(f"advantage baseline must be 'family' or 'task', got {baseline!r}")
    if baseline == "task" and sample.task is not None:
        return (sample.role, sample.family, sample.task)
    return (sample.role, sample.family)


def proposal_jobs(
    pairs: Sequence[tuple[str, str]],
    families: Sequence[str],
    tasks_per_teacher: int,
    references: dict[str, list[list[Task]]],
    n_inputs: int,
) -> list[ProposalJob]:
    """Proposal prompts for each (teacher, student) pair; ``references[family]`` is consumed in order
    (one list of K tasks per prompt of that family, sampled by the league's buffers)."""
    jobs = []
    cursor = {family: 0 for family in families}
    for teacher, student in pairs:
        for i in range(tasks_per_teacher):
            family = families[i % len(families)]
            refs = references[family][cursor[family]]
            cursor[family] += 1
            program = refs[0].program if family == "code_f" else None
            jobs.append(ProposalJob(teacher, student, family, teacher_prompt(family, refs, n_inputs=n_inputs), program))
    return jobs


def reference_counts(pairs: Sequence[tuple[str, str]], families: Sequence[str], tasks_per_teacher: int) -> dict[str, int]:
    """How many reference lists :func:`proposal_jobs` consumes per family."""
    counts = {family: 0 for family in families}
    for _ in pairs:
        for i in range(tasks_per_teacher):
            counts[families[i % len(families)]] += 1
    return counts


def parsed_proposals(jobs: Sequence[ProposalJob], n_inputs: int) -> list[Any]:
    return [parse_proposal(j.family, j.text, program=j.reference_program, n_inputs=n_inputs) for j in jobs]


def solve_jobs(jobs: Sequence[ProposalJob], validations: Sequence[Any]) -> list[SolveJob]:
    return [
        SolveJob(v.task, index, jobs[index].student, student_prompt(v.task))
        for index, v in enumerate(validations)
        if v.valid
    ]


def solve_rates(n_proposals: int, solves: Sequence[SolveJob], judgements: Sequence[Sequence[Any]]) -> list[float | None]:
    """rho per proposal: the fraction of its rollouts judged correct (None for an invalid proposal)."""
    rho: list[float | None] = [None] * n_proposals
    for job, verdicts in zip(solves, judgements):
        rho[job.proposal] = sum(bool(v.correct) for v in verdicts) / max(1, len(verdicts))
    return rho


def proposer_reward(rho: float | None, rewards: RewardsConfig, single_agent: bool) -> float:
    if rho is not None and single_agent:
        return learnability_reward(rho)
    return teacher_reward(rho is not None, rho, invalid=rewards.teacher_invalid)


def teacher_samples(jobs: Sequence[ProposalJob], rho: Sequence[float | None], rewards: RewardsConfig,
                    single_agent: bool) -> list[Sample]:
    return [
        Sample(j.teacher, "teacher", j.family, j.generation.prompt_token_ids, j.generation.token_ids,
               j.generation.logprobs, proposer_reward(rho[i], rewards, single_agent), j.generation.adapter_version)
        for i, j in enumerate(jobs)
    ]


def student_samples(solves: Sequence[SolveJob], judgements: Sequence[Sequence[Any]], rewards: RewardsConfig) -> list[Sample]:
    return [
        Sample(s.student, "student", s.task.family, g.prompt_token_ids, g.token_ids, g.logprobs,
               student_reward(v.correct, v.well_formed, wrong=rewards.student_wrong,
                              malformed=rewards.student_malformed, correct_reward=rewards.student_correct),
               g.adapter_version, task=s.proposal)
        for s, verdicts in zip(solves, judgements)
        for g, v in zip(s.generations, verdicts)
    ]
