"""One record per proposal of a step (``RUN_DIR/proposals.jsonl``): what the teacher's reward paid for what it wrote.

A record: ``member`` (the teacher), ``student``, ``family``, ``valid`` and ``reason`` (the verifier's, when invalid),
``rho`` (None when invalid), ``completion_tokens``, ``written`` (a program the teacher wrote: a valid code_o or code_i
task; a code_f task's program was drawn from the buffers), the four complexity metrics of the task's program
(``verifier.metrics.program_metrics``; None when invalid), ``reward`` and ``advantage``.

The advantage is the one the learner trains with: the same function (``learners.pg_loss.group_normalised_advantages``)
over the same groups (member, role, family: ``rollouts.advantage_group``; teachers' groups never split by task) and the
same settings (``rl.advantage_norm``, ``rl.advantage_weighting``); empty completions get none, as the learner leaves
them out. Pure: no Ray.
"""

from __future__ import annotations

from typing import Any, Sequence

from configs.schema import RLConfig
from learners.pg_loss import group_normalised_advantages
from reporting.step_metrics import COMPLEXITY_KEYS, WRITTEN_FAMILIES
from verifier.metrics import program_metrics


def teacher_advantages(samples: Sequence[Any], rl: RLConfig) -> list[float | None]:
    """The advantage each teacher sample of ``samples`` (``rollouts.Sample``, role ``teacher``, in order) trains with;
    None for an empty completion. Student samples are in other groups, so they do not change these."""
    teacher = [s for s in samples if s.role == "teacher"]
    kept = [i for i, s in enumerate(teacher) if s.completion_ids]
    out: list[float | None] = [None] * len(teacher)
    if not kept:
        return out
    adv = group_normalised_advantages(
        [teacher[i].reward for i in kept], [(teacher[i].member, teacher[i].family) for i in kept],
        [len(teacher[i].completion_ids) for i in kept],
        whiten=rl.advantage_norm == "whiten", weighting=rl.advantage_weighting,
    )
    for i, a in zip(kept, adv.tolist()):
        out[i] = round(a, 6)
    return out


def proposal_records(proposals: Sequence[Any], validations: Sequence[Any], rho: Sequence[float | None],
                     samples: Sequence[Any], rl: RLConfig) -> list[dict[str, Any]]:
    """The step's records (module docstring); ``samples`` are the step's samples, teacher samples in proposal order
    (``rollouts.teacher_samples``)."""
    teacher = [s for s in samples if s.role == "teacher"]
    if len(teacher) != len(proposals):
        raise ValueError(f"{len(teacher)} teacher samples for {len(proposals)} proposals")
    advantages = teacher_advantages(samples, rl)
    out = []
    for i, (job, verdict, sample) in enumerate(zip(proposals, validations, teacher)):
        metrics = program_metrics(verdict.task.program) if verdict.valid else None
        out.append({
            "member": job.teacher, "student": job.student, "family": job.family, "valid": bool(verdict.valid),
            "reason": None if verdict.valid else verdict.reason, "rho": rho[i],
            "completion_tokens": len(sample.completion_ids),
            "written": bool(verdict.valid and job.family in WRITTEN_FAMILIES),
            **{key: (metrics[key] if metrics else None) for key in COMPLEXITY_KEYS},
            "reward": round(sample.reward, 6), "advantage": advantages[i],
        })
    return out
