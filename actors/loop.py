"""One PopuLoRA step: match, propose, validate, solve, update (and evolve every E steps).

Each phase's seconds go to the step's row (``phase_seconds``): match, propose, validate, solve (generation),
judge (the verifiers on the answers), train, handover (new adapter versions to the engines), record (the
league's outcomes), evolve; the driver adds evaluate, and logs each checkpoint's seconds as an event.

On-policy: every phase of step t uses the adapter versions published at the end of step t-1; the
update of step t trains on samples drawn by exactly those versions (the engine reports the version
that produced each sample). Phases are not overlapped across steps.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import ray

from rollouts import (
    StepPrompts,
    bounded_validations,
    drop_rejected_proposals,
    drop_rejected_solves,
    judge_items,
    parsed_proposals,
    prompt_metrics,
    proposal_jobs,
    reference_counts,
    solve_jobs,
    solve_rates,
    student_samples,
    teacher_samples,
)
from reporting.step_metrics import step_row

if TYPE_CHECKING:
    from actors.system import System


class PhaseTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[phase] = round(time.perf_counter() - start, 4)


def run_step(system: "System", step: int, prompts: StepPrompts) -> dict[str, Any]:
    """Run step ``step`` of the loop on the actors of ``system``; returns its metrics row.

    ``prompts`` words the prompts and bounds the tasks (``StepPrompts.from_config``). A request the
    engine rejects (it does not fit the context) is dropped alone and counted in the row.
    """
    cfg, league, timer = system.config, system.league, PhaseTimer()
    families, n_inputs = cfg.tasks.families, cfg.tasks.code_f_inputs

    with timer("match"):
        pairs = ray.get(league.match.remote(step))  # [(teacher, student)]; single agent: [(a, a)]

    with timer("propose"):
        counts = reference_counts(pairs, families, cfg.tasks.tasks_per_teacher)
        references = ray.get(league.references.remote(counts, cfg.tasks.references_k))
        proposals = proposal_jobs(pairs, families, cfg.tasks.tasks_per_teacher, references, n_inputs, prompts)
        outputs = system.generate([system.request(j.teacher, j.prompt, seed=system.seed(step, "p", i))
                                   for i, j in enumerate(proposals)])
        for job, (generation,) in zip(proposals, outputs):
            job.text, job.generation = generation.text, generation
        proposals, dropped = drop_rejected_proposals(proposals)

    with timer("validate"):
        validations = system.verifiers.validate(proposals, parsed_proposals(proposals, n_inputs, prompts), n_inputs)
        validations = bounded_validations(validations, prompts)

    with timer("solve"):
        solves = solve_jobs(proposals, validations, prompts)
        outputs = system.generate([system.request(s.student, s.prompt, n=cfg.tasks.rollouts_k,
                                                  seed=system.seed(step, "s", i)) for i, s in enumerate(solves)])
        for job, generations in zip(solves, outputs):
            job.generations = generations
        solves, validations, dropped_solves = drop_rejected_solves(solves, validations)
        dropped += dropped_solves

    with timer("judge"):
        judgements = system.verifiers.judge(judge_items(solves))
        per_job = [judgements[i * cfg.tasks.rollouts_k:(i + 1) * cfg.tasks.rollouts_k] for i in range(len(solves))]
        rho = solve_rates(len(proposals), solves, per_job)

    # update: train every member on its samples, hand the new versions to the engines, record the outcomes
    with timer("train"):
        samples = teacher_samples(proposals, rho, cfg.rewards, cfg.population.single_agent)
        samples += student_samples(solves, per_job, cfg.rewards)
        train_stats = system.train(samples)
    with timer("handover"):
        system.publish_adapters()
    with timer("record"):
        outcomes = [(j.teacher, j.student, rho[i] is not None, rho[i] or 0.0) for i, j in enumerate(proposals)]
        ray.get(league.record.remote(step, outcomes, [v.task.to_dict() for v in validations if v.valid]))

    with timer("evolve"):
        events = system.evolve(step)  # empty except every E steps

    members = ray.get(league.members.remote())
    return step_row(step, members, system.coverage, families, proposals, validations, solves, per_job, rho, samples,
                    train_stats, events, timer.seconds, prompt_metrics(proposals, solves, dropped, prompts))
