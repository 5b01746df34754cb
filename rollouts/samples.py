"""Completions with their rewards, and a learner's view of them (pure, no Ray).

- :class:`Sample`: one completion with its reward, for the learner of its member.
- :func:`teacher_samples` / :func:`student_samples`: the game's rewards (``rollouts.rewards``) on each completion.
- :func:`advantage_group`: the key its reward is normalised within (``rl.advantage_baseline``).
- :func:`behaviour_problem` / :func:`split_by_behaviour`: a sample whose behaviour log-probs are missing or not one
  finite log-probability (<= 0) per completion token cannot be importance-weighted; it is dropped and counted per
  member, never trained on with a weight of 1.
- :func:`learner_samples`: a learner's samples as ``learners.batching.Sample`` (slot, advantage group, and with the
  importance correction the behaviour log-probs), with what was dropped and how far behind the generating adapters
  were.
- :func:`mark_kl_readout`: the few samples per member and role whose KL to the base the learners measure this step
  (``rl.kl_readout_every``, ``rl.kl_readout_samples``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from configs.schema import RewardsConfig
from rollouts.jobs import ProposalJob, SolveJob
from rollouts.rewards import proposer_reward, student_reward


@dataclass
class Sample:
    """One sampled completion of ``member`` acting as ``role`` on a ``family`` task, with its reward.

    ``logprobs`` are the behaviour policy's log mu(token | prefix), one per completion token: the
    distribution the engine sampled from (temperature and top-p applied, 0 for greedy decoding;
    ``inference.requests``), by the adapter version ``adapter_version``. An importance-corrected update
    (``rl.importance_correction``) weighs each token by pi / mu with them.
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
    fixed_advantage: float | None = None  # a supervised target (rollouts.hindsight), not a sampled completion
    kl_readout: bool = False  # one of the step's KL-to-base readout samples (:func:`mark_kl_readout`)


def advantage_group(sample: Sample, baseline: str) -> tuple:
    """The whitening group of ``sample`` besides its member: ``(role, family)`` (AZR's Task-Relative
    REINFORCE++), or with ``baseline == "task"`` a student rollout's ``(role, family, task)``, so each
    task's rollouts are compared with each other only (GRPO's per-prompt baseline)."""
    if baseline not in ("family", "task"):
        raise ValueError(f"advantage baseline must be 'family' or 'task', got {baseline!r}")
    if baseline == "task" and sample.task is not None:
        return (sample.role, sample.family, sample.task)
    return (sample.role, sample.family)


# log mu(y) > 0 would be a probability above 1; allow float rounding of a token the engine was sure of.
LOGPROB_SLACK = 1e-4


def behaviour_problem(sample: Sample) -> str | None:
    """Why ``sample.logprobs`` cannot serve as the behaviour log-probs of its completion, or None when they can:
    one finite log mu(y_t) <= 0 per completion token (``inference.requests``'s convention)."""
    logprobs = sample.logprobs
    if logprobs is None or (len(logprobs) == 0 and len(sample.completion_ids) > 0):
        return "missing behaviour log-probs"
    if len(logprobs) != len(sample.completion_ids):
        return f"misaligned behaviour log-probs: {len(logprobs)} for {len(sample.completion_ids)} completion tokens"
    if any(not (x == x and abs(x) != float("inf")) for x in logprobs):
        return "non-finite behaviour log-probs"
    if any(x > LOGPROB_SLACK for x in logprobs):
        return f"behaviour log-probs above 0 (a probability above 1): max {max(logprobs):.3g}"
    return None


def split_by_behaviour(samples: Sequence[Sample]) -> tuple[list[Sample], dict[str, int]]:
    """The samples whose behaviour log-probs are usable (:func:`behaviour_problem`), and per member the count
    of those dropped for it."""
    kept: list[Sample] = []
    dropped: dict[str, int] = {}
    for s in samples:
        if behaviour_problem(s) is None:
            kept.append(s)
        else:
            dropped[s.member] = dropped.get(s.member, 0) + 1
    return kept, dropped


def learner_samples(
    samples: Sequence[Sample], slots: dict[str, int], versions: dict[str, int], baseline: str, importance_correction: str
) -> tuple[list[Any], dict[str, dict[str, float]]]:
    """``samples`` (of members in ``slots``) as the learner's ``learners.batching.Sample``; empty completions
    are left out. With ``importance_correction == "tis"`` each carries its behaviour log-probs, a sample
    without usable ones is dropped (:func:`split_by_behaviour`), and per member the extra statistics are
    ``dropped_behaviour`` (samples dropped) and ``behind``: the mean number of updates between the adapter
    version that generated a kept sample and ``versions[member]``, the learner's (0 serial, 1 overlapped).
    """
    from learners.batching import Sample as LearnerSample

    kept = [s for s in samples if s.completion_ids]
    tis = importance_correction == "tis"
    extra: dict[str, dict[str, float]] = {}
    if tis:
        kept, dropped = split_by_behaviour(kept)
        for member in sorted({s.member for s in samples}):
            gaps = [versions[member] - s.adapter_version for s in kept if s.member == member and s.adapter_version is not None]
            extra[member] = {"dropped_behaviour": float(dropped.get(member, 0)),
                             "behind": sum(gaps) / len(gaps) if gaps else 0.0}
    batch = [LearnerSample(slots[s.member], s.prompt_ids, s.completion_ids, s.reward, advantage_group(s, baseline),
                           behaviour_logprobs=s.logprobs if tis else None, fixed_advantage=s.fixed_advantage,
                           kl_readout=s.kl_readout)
             for s in kept]
    return batch, extra


def mark_kl_readout(samples: Sequence[Sample], step: int, every: int, per_member: int) -> int:
    """On every ``every``-th step (none when ``every`` is 0), mark ``per_member`` of each (member, role)'s sampled
    completions for the KL-to-base readout: of its m samples in step order, those at indices floor(i m / n),
    i = 0..n-1 (n = min(per_member, m): spread over its tasks, not the first task's rollouts). Supervised targets
    (``fixed_advantage``) and empty completions are not the policy's samples and are never marked. Sets
    ``Sample.kl_readout`` in place; returns how many were marked."""
    if every <= 0 or step % every:
        return 0
    groups: dict[tuple[str, str], list[Sample]] = {}
    for sample in samples:
        if sample.fixed_advantage is None and sample.completion_ids:
            groups.setdefault((sample.member, sample.role), []).append(sample)
    marked = 0
    for group in groups.values():
        n = min(per_member, len(group))
        for i in range(n):
            group[i * len(group) // n].kl_readout = True
        marked += n
    return marked


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
