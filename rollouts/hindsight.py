"""Hindsight supervision of the students (optional, off by default: not the paper's method).

For a valid task that none of its student's rollouts solved (rho = 0), the verifier already knows a right answer:
the output of a code_o task, the teacher's own input of a code_i task, the program of a code_f task. With
``rl.hindsight_coef`` c > 0 each such task adds one supervised target to its student's update: the student's
prompt followed by the well-formed answer (``verifier.prompts.student_response``), every token carrying the fixed
advantage c (``learners.batching.Sample.fixed_advantage``), so its gradient is behavioural cloning,
``-c grad log pi(y*) / N_a``, on exactly the tasks at the teachers' frontier (OpenAI's asymmetric self-play, "Alice
behavioural cloning", 2021). Pure: no Ray.
"""

from __future__ import annotations

from typing import Sequence

from rollouts.jobs import SolveJob
from rollouts.samples import Sample
from rollouts.step_prompts import StepPrompts
from verifier.prompt_styles import THINK
from verifier.prompts import student_response
from verifier.tasks import Task


def known_answer(task: Task) -> str:
    """The answer the verifier already holds: code_o's output, code_i's input (the teacher's), code_f's program."""
    return {"code_o": task.output, "code_i": task.input, "code_f": task.program}[task.family]


def hindsight_completion(task: Task, prompt: str) -> str:
    """The well-formed answer to ``task`` as the completion of ``prompt`` (without the ``<think>`` a prompt of the
    r1/chat styles already ends with)."""
    text = student_response(task.family, known_answer(task))
    return text[len(THINK):] if prompt.rstrip().endswith(THINK) and text.startswith(THINK) else text


def hindsight_samples(solves: Sequence[SolveJob], rho: Sequence[float | None], prompts: StepPrompts,
                      coef: float) -> list[Sample]:
    """One supervised target per solve job whose task no rollout solved (module docstring); none when ``coef`` is 0.
    A target longer than ``inference.max_tokens`` is left out (the student could not have written it)."""
    tokenizer = prompts.prompter.tokenizer
    if coef <= 0 or tokenizer is None:
        return []
    out = []
    for job in solves:
        if rho[job.proposal] != 0 or not job.generations:
            continue
        ids = tokenizer(hindsight_completion(job.task, job.prompt), add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            ids = list(ids) + [tokenizer.eos_token_id]
        if len(ids) > prompts.max_tokens:
            continue
        first = job.generations[0]
        out.append(Sample(job.student, "student", job.task.family, list(first.prompt_token_ids), list(ids), [], 0.0,
                          first.adapter_version, task=job.proposal, fixed_advantage=coef))
    return out
