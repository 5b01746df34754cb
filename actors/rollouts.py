"""What one step does with text: prompts in, rewards and training samples out (pure, no Ray).

The loop (``actors.loop``) calls these between the actor calls:

- :func:`proposal_jobs`: every matched teacher gets ``tasks_per_teacher`` proposal prompts, families
  in rotation, each conditioned on K reference tasks from the buffers.
- :func:`solve_jobs`: every valid task becomes a student prompt for the teacher's matched student.
- :func:`solve_rates`: rho per proposal, the solved fraction of its student's rollouts.
- :class:`Sample`: one completion with its reward, for the learner of its member.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from verifier.prompts import parse_proposal, student_prompt, teacher_prompt
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
    prompt: str
    completion_ids: list[int]
    logprobs: list[float]
    reward: float
    adapter_version: int | None = None


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
