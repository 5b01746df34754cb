"""One PopuLoRA step: match, propose, validate, solve, update (and evolve every E steps, never at the run's last).

Each phase's seconds go to the step's row (``phase_seconds``): match, propose, validate, solve (generation),
judge (the verifiers on the answers), record (the league's outcomes), train, handover (new adapter versions to
the engines), evolve; the driver adds evaluate, and logs each checkpoint's seconds as an event. Colocated
(``resources.colocated``): the engines sleep before the update and wake after it, both counted as ``switch``.

Serial (``run.max_staleness: 0``): every phase of step t uses the adapter versions published at the end of
step t-1, and the update of step t trains on samples drawn by exactly those versions (the engine reports the
version that produced each sample).

Overlapped (``run.max_staleness: 1``): while the learners train on step t's samples, the engines generate
step t+1 (match .. judge) with the versions of step t-1, one update behind; the update of step t+1 weighs
each token by min(pi_old / mu, C) (``rl.importance_correction: tis``, ``learners.pg_loss``). The rules at a
step boundary t -> t+1:

- ratings: step t's outcomes are recorded as soon as they are judged, before step t+1 is matched, so step
  t+1's matches use the ratings after step t, as in a serial run (the league sees the same calls in the same
  order);
- the pipeline drains (:func:`drains_after`) after a checkpoint step, an evolution step and the last step:
  step t+1 is then generated after update t is published. So evolution never replaces a member whose
  rollouts are in flight, a checkpoint never has rollouts in flight (it needs nothing beyond a serial one),
  and a run resumed or recovered from it continues exactly as the uninterrupted overlapped run, which
  drained there too;
- evaluation after step t (``eval.every``) scores the adapters of update t, published at the end of step t,
  as in a serial run; step t+1's rollouts, already generated, are not affected;
- the row of step t+1 keeps the seconds of its own generation phases, spent while step t trained; step t's
  ``train`` covers the update and the overlapped generation, from start to the learners' answer.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import ray

from configs.schema import Config
from evolution.league import idle_student_share
from rollouts import (
    DroppedRequest,
    ProposalJob,
    Sample,
    SolveJob,
    StepPrompts,
    bounded_validations,
    drop_rejected_proposals,
    drop_rejected_solves,
    judge_items,
    mark_kl_readout,
    parsed_proposals,
    prompt_metrics,
    proposal_jobs,
    reference_counts,
    solve_jobs,
    solve_rates,
    student_samples,
    teacher_samples,
)
from rollouts.hindsight import hindsight_samples
from reporting.proposal_records import proposal_records
from reporting.step_metrics import step_row

if TYPE_CHECKING:
    from actors.system import System


class PhaseTimer:
    """Seconds per phase; a phase timed twice adds up (the colocated ``switch``: sleep before the update, wake after)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + time.perf_counter() - start, 4)


def drains_after(config: Config, step: int, last_step: int) -> bool:
    """Whether step ``step + 1`` waits for update ``step`` before it generates (see the module docstring):
    always in a serial run; in an overlapped one after a checkpoint step, an evolution step and the last step."""
    return config.run.max_staleness == 0 or config.overlap_drains_after(step, last_step)


@dataclass
class Rollouts:
    """What a step's generation phases made (match .. judge, outcomes recorded): its update's samples and row."""

    step: int
    pairs: list[tuple[str, str]]  # the step's (teacher, student) matches, in the league's teacher order
    proposals: list[ProposalJob]
    validations: list[Any]
    solves: list[SolveJob]
    judgements: list[list[Any]]
    rho: list[float | None]
    dropped: list[DroppedRequest]
    samples: list[Sample]
    seconds: dict[str, float]


def generate_rollouts(system: "System", step: int, prompts: StepPrompts) -> Rollouts:
    """Match, propose, validate, solve, judge and record step ``step`` with the adapters the engines serve now.

    A request the engine rejects (it does not fit the context) is dropped alone and counted in the row.
    """
    cfg, league, timer = system.config, system.league, PhaseTimer()
    families, n_inputs = cfg.tasks.families, cfg.tasks.code_f_inputs

    with timer("match"):
        pairs = ray.get(league.match.remote(step))  # [(teacher, student)]; single agent: [(a, a)]

    with timer("propose"):
        per_teacher, rotation = cfg.tasks.tasks_per_teacher, cfg.tasks.family_rotation
        counts = reference_counts(pairs, families, per_teacher, rotation, step)
        references = ray.get(league.references.remote(counts, cfg.tasks.references_k))
        proposals = proposal_jobs(pairs, families, per_teacher, references, n_inputs, prompts, rotation, step)
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

    with timer("record"):
        outcomes = [(j.teacher, j.student, rho[i] is not None, rho[i] or 0.0) for i, j in enumerate(proposals)]
        ray.get(league.record.remote(step, outcomes, [v.task.to_dict() for v in validations if v.valid]))

    samples = teacher_samples(proposals, rho, cfg.rewards, cfg.population.single_agent)
    samples += student_samples(solves, per_job, cfg.rewards)
    samples += hindsight_samples(solves, rho, prompts, cfg.rl.hindsight_coef)  # none unless rl.hindsight_coef > 0
    mark_kl_readout(samples, step, cfg.rl.kl_readout_every, cfg.rl.kl_readout_samples)  # the learners' KL to the base
    return Rollouts(step, pairs, proposals, validations, solves, per_job, rho, dropped, samples, timer.seconds)


def run_step(system: "System", step: int, prompts: StepPrompts, ahead: Rollouts | None = None,
             overlap: bool = False, last_step: int | None = None) -> tuple[dict[str, Any], Rollouts | None]:
    """Run step ``step`` on the actors of ``system``; returns its metrics row and, with ``overlap``, step
    ``step + 1``'s rollouts, generated while this step's update ran (one update behind).

    ``ahead``: this step's rollouts when the previous call generated them; None generates them now.
    ``prompts`` words the prompts and bounds the tasks (``StepPrompts.from_config``). ``last_step``: the run's last
    step, at which nothing evolves (``ReplacementPolicy.due``); None: no planned end.
    """
    now = ahead if ahead is not None else generate_rollouts(system, step, prompts)
    timer = PhaseTimer()
    timer.seconds.update(now.seconds)
    colocated = system.config.resources.colocated
    if colocated:
        with timer("switch"):
            system.sleep_engines()
    learn = system.config.rl.train  # false: the control in which nothing learns (no update, nothing to hand over)
    with timer("train"):  # the learners train while, overlapped, the engines generate the next step
        training = system.start_training(now.samples) if learn else []
        members = ray.get(system.league.members.remote())
        upcoming = generate_rollouts(system, step + 1, prompts) if overlap else None
        train_stats = system.finish_training(training) if learn else {}
    if colocated:
        with timer("switch"):
            system.wake_engines()
    if learn:
        with timer("handover"):
            system.publish_adapters()
    with timer("evolve"):
        events = system.evolve(step, last_step)  # empty except every E steps, and never at the last step
    if events and upcoming is not None:
        raise RuntimeError(f"evolution at step {step} with step {step + 1}'s rollouts in flight: drains_after must drain there")
    students = [m["id"] for m in members if m["role"] in ("student", "agent")]  # the step's: read before evolution
    if events:
        members = ray.get(system.league.members.remote())
    row = step_row(step, members, system.coverage, system.config.tasks.families, now.proposals, now.validations,
                   now.solves, now.judgements, now.rho, now.samples, train_stats, events, timer.seconds,
                   prompt_metrics(now.proposals, now.solves, now.dropped, prompts))
    row["idle_student_share"] = round(idle_student_share(now.pairs, students), 4)  # students no teacher drew
    row["proposals"] = proposal_records(now.proposals, now.validations, now.rho, now.samples, system.config.rl)
    if system.config.run.max_staleness:
        row["staleness"] = 0 if ahead is None else 1  # updates between the generating adapters and the learners'
    return row, upcoming
