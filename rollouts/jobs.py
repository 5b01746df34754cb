"""The step's generation jobs and what the verifier made of them (pure, no Ray).

- :func:`teacher_families`: the family of each of a teacher's tasks in a step (``tasks.family_rotation``): round-robin
  over its tasks, or one family for all of them, rotating by step and by the teacher's place in the step's pairs.
- :func:`proposal_jobs`: every matched teacher gets ``tasks_per_teacher`` proposal prompts of those families, each
  conditioned on K reference tasks from the buffers, trimmed (longest first) until the prompt leaves room for
  ``max_tokens`` in the context; :func:`reference_counts` says how many reference lists of each family that takes.
- :func:`parsed_proposals` / :func:`bounded_validations`: proposals over the size limits, or whose student prompt
  would not fit the context, are invalid with the reason.
- :func:`drop_rejected_proposals` / :func:`drop_rejected_solves`: a request the engine rejected (it did not fit the
  context) is dropped alone and recorded as a :class:`DroppedRequest`.
- :func:`solve_jobs`: every valid task becomes a student prompt for the teacher's matched student.
- :func:`solve_rates`: rho per proposal, the solved fraction of its student's rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from rollouts.step_prompts import StepPrompts
from verifier.families import Validation
from verifier.prompts import Proposal, parse_proposal, student_prompt, teacher_prompt
from verifier.tasks import Task


@dataclass
class ProposalJob:
    teacher: str
    student: str
    family: str
    prompt: str
    reference_program: str | None = None  # code_f: the program the teacher writes inputs for
    text: str = ""
    generation: Any = None
    references: int = 0  # references shown (after trimming to the prompt budget)
    references_dropped: int = 0  # references left out so the prompt fits
    reference_tasks: list[Task] = field(default_factory=list)  # drawn from the buffers for this prompt (code_f: the probed task)


@dataclass
class SolveJob:
    task: Task
    proposal: int  # index of the ProposalJob
    student: str
    prompt: str
    generations: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class DroppedRequest:
    """A generation request the engine rejected (it did not fit the context): no sample, no reward."""

    role: str  # "teacher" or "student"
    member: str
    family: str
    reason: str


ROTATIONS = ("task", "step")
"""``tasks.family_rotation``'s values (configs/schema.py)."""


def teacher_families(position: int, families: Sequence[str], tasks_per_teacher: int, rotation: str = "task",
                     step: int = 0) -> list[str]:
    """The family of each of the ``tasks_per_teacher`` tasks of the step's ``position``-th matched teacher.

    ``rotation == "task"``: round-robin over its tasks, the same for every teacher and step (6 tasks over 3 families:
    two of each, so its advantage group of a family, ``rollouts.samples.advantage_group``, holds two proposals).
    ``"step"``: all of them ``families[(step + position) % len(families)]``, so the group holds all
    ``tasks_per_teacher`` (the paper's groups of ~21 at 64 tasks a teacher; the dynamics study in its regime), the teachers of one step cover
    different families, and over consecutive steps every teacher proposes every family.
    """
    if rotation == "task":
        return [families[i % len(families)] for i in range(tasks_per_teacher)]
    if rotation == "step":
        return [families[(step + position) % len(families)]] * tasks_per_teacher
    raise ValueError(f"family rotation must be one of {ROTATIONS}, got {rotation!r}")


def proposal_jobs(
    pairs: Sequence[tuple[str, str]],
    families: Sequence[str],
    tasks_per_teacher: int,
    references: dict[str, list[list[Task]]],
    n_inputs: int,
    prompts: StepPrompts | None = None,
    rotation: str = "task",
    step: int = 0,
) -> list[ProposalJob]:
    """Proposal prompts for each (teacher, student) pair, of the families :func:`teacher_families` gives the
    teacher's place in ``pairs`` at ``step``; ``references[family]`` is consumed in order (one list of K tasks per
    prompt of that family, sampled by the league's buffers; :func:`reference_counts` says how many).

    With ``prompts`` the prompt is in its style and references are dropped (longest first) until it
    fits the prompt budget; without, it is the compact prompt with every reference.
    """
    jobs = []
    cursor = {family: 0 for family in families}
    for position, (teacher, student) in enumerate(pairs):
        for family in teacher_families(position, families, tasks_per_teacher, rotation, step):
            refs = references[family][cursor[family]]
            cursor[family] += 1
            program = refs[0].program if family == "code_f" else None
            if prompts is None:
                prompt, kept = teacher_prompt(family, refs, n_inputs=n_inputs), len(refs)
            else:
                prompt, _, kept = prompts.prompter.fitted_teacher(family, refs, prompts.budget)
            jobs.append(ProposalJob(teacher, student, family, prompt, program, references=kept,
                                    references_dropped=len(refs) - kept, reference_tasks=list(refs)))
    return jobs


def reference_counts(pairs: Sequence[tuple[str, str]], families: Sequence[str], tasks_per_teacher: int,
                     rotation: str = "task", step: int = 0) -> dict[str, int]:
    """How many reference lists :func:`proposal_jobs` consumes per family (the same ``rotation`` and ``step``)."""
    counts = {family: 0 for family in families}
    for position in range(len(pairs)):
        for family in teacher_families(position, families, tasks_per_teacher, rotation, step):
            counts[family] += 1
    return counts


def truncated(generation: Any) -> bool:
    """Whether a generation stopped at ``max_tokens`` (its answer may be cut off)."""
    return getattr(generation, "finish_reason", None) == "length"


def parsed_proposals(jobs: Sequence[ProposalJob], n_inputs: int, prompts: StepPrompts | None = None) -> list[Proposal]:
    """Parse each job's text (a cut-off malformed response says ``truncated``); with ``prompts`` a
    proposal whose program, inputs or message is over the size limits gets that as its error."""
    out = []
    for j in jobs:
        proposal = parse_proposal(j.family, j.text, program=j.reference_program, n_inputs=n_inputs,
                                  truncated_at_limit=truncated(j.generation))
        if prompts is not None and proposal.error is None:
            proposal.error = prompts.limits.proposal_problem(j.family, proposal, prompts.token_counter)
        out.append(proposal)
    return out


def student_prompt_of(task: Task, prompts: StepPrompts | None) -> str:
    return student_prompt(task) if prompts is None else prompts.prompter.student(task)


def bounded_validations(validations: Sequence[Validation], prompts: StepPrompts) -> list[Validation]:
    """The validations with every valid task that breaks a size limit (its outputs, now known), or whose
    student prompt would not leave ``max_tokens`` of room in the context, turned invalid with the reason."""
    out = []
    for v in validations:
        if v.valid:
            problem = prompts.limits.task_problem(v.task, prompts.token_counter)
            if problem is None:
                tokens = prompts.count_tokens(student_prompt_of(v.task, prompts))
                if tokens is not None and tokens > prompts.budget:
                    problem = (f"the task is too large to pose: its solver prompt is {tokens} tokens, over the prompt "
                               f"budget of {prompts.budget} (model.max_seq_len {prompts.max_seq_len} - "
                               f"inference.max_tokens {prompts.max_tokens})")
            if problem is not None:
                v = replace(v, valid=False, task=None, reason=problem)
        out.append(v)
    return out


def solve_jobs(jobs: Sequence[ProposalJob], validations: Sequence[Any], prompts: StepPrompts | None = None) -> list[SolveJob]:
    return [
        SolveJob(v.task, index, jobs[index].student, student_prompt_of(v.task, prompts))
        for index, v in enumerate(validations)
        if v.valid
    ]


def drop_rejected_proposals(jobs: Sequence[ProposalJob]) -> tuple[list[ProposalJob], list[DroppedRequest]]:
    """Split off the proposal jobs whose request the engine rejected: they get no sample, reward or match."""
    kept = [j for j in jobs if not j.generation.rejected]
    dropped = [DroppedRequest("teacher", j.teacher, j.family, j.generation.error or "rejected")
               for j in jobs if j.generation.rejected]
    return kept, dropped


def drop_rejected_solves(
    solves: Sequence[SolveJob], validations: Sequence[Validation]
) -> tuple[list[SolveJob], list[Validation], list[DroppedRequest]]:
    """Split off the solve jobs whose request the engine rejected. Their rollouts are dropped, and their
    task is not posable, so its proposal turns invalid with the engine's reason."""
    kept, dropped, out = [], [], list(validations)
    for s in solves:
        if any(g.rejected for g in s.generations):
            reason = next(g.error for g in s.generations if g.rejected) or "rejected"
            dropped.append(DroppedRequest("student", s.student, s.task.family, reason))
            out[s.proposal] = replace(out[s.proposal], valid=False, task=None, reason=f"the solver request was rejected: {reason}")
        else:
            kept.append(s)
    return kept, out, dropped


def judge_items(solves: Sequence[SolveJob]) -> list[tuple[Task, str, bool]]:
    """(task, answer text, truncated) for every rollout of every solve job, in order."""
    return [(s.task, g.text, truncated(g)) for s in solves for g in s.generations]


def solve_rates(n_proposals: int, solves: Sequence[SolveJob], judgements: Sequence[Sequence[Any]]) -> list[float | None]:
    """rho per proposal: the fraction of its rollouts judged correct (None for an invalid proposal)."""
    rho: list[float | None] = [None] * n_proposals
    for job, verdicts in zip(solves, judgements):
        rho[job.proposal] = sum(bool(v.correct) for v in verdicts) / max(1, len(verdicts))
    return rho
