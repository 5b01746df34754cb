"""What one step does with text: prompts in, rewards and training samples out (pure, no Ray).

The loop (``actors.loop``) calls these between the actor calls:

- :class:`StepPrompts`: the prompt style (``tasks.prompt_style``), the model's tokenizer, the task
  size limits and the context budget; built once before the actors start (a ``chat`` style on a
  model without a chat template fails there).
- :func:`proposal_jobs`: every matched teacher gets ``tasks_per_teacher`` proposal prompts, families
  in rotation, each conditioned on K reference tasks from the buffers, trimmed (longest first) until
  the prompt leaves room for ``max_tokens`` in the context.
- :func:`parsed_proposals` / :func:`bounded_validations`: proposals over the size limits, or whose
  student prompt would not fit the context, are invalid with the reason.
- :func:`drop_rejected_proposals` / :func:`drop_rejected_solves`: a request the engine rejected (it
  did not fit the context) is dropped alone and recorded as a :class:`DroppedRequest`.
- :func:`solve_jobs`: every valid task becomes a student prompt for the teacher's matched student.
- :func:`solve_rates`: rho per proposal, the solved fraction of its student's rollouts.
- :func:`teacher_samples` / :func:`student_samples`: DESIGN.md's rewards on each completion; teacher
  -1 invalid, 0 when rho = 0, else 1 - rho (single agent: AZR's learnability, 1 - rho for
  0 < rho < 1, else 0); student correct / wrong / malformed.
- :class:`Sample`: one completion with its reward, for the learner of its member.
- :func:`advantage_group`: the key its reward is whitened within (``rl.advantage_baseline``).
- :func:`behaviour_problem` / :func:`split_by_behaviour`: a sample whose behaviour log-probs are missing or
  not one finite log-probability (<= 0) per completion token cannot be importance-weighted; it is dropped
  and counted per member, never trained on with a weight of 1.
- :func:`learner_samples`: a learner's samples as ``learners.batching.Sample`` (slot, advantage group, and
  with the importance correction the behaviour log-probs), with what was dropped and how far behind the
  generating adapters were.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from configs.schema import Config, RewardsConfig
from verifier.families import Validation
from verifier.prompt_styles import Prompter, PromptStyleError, TaskRules
from verifier.prompts import Proposal, parse_proposal, student_prompt, teacher_prompt
from rollouts.rewards import proposer_reward, student_reward
from verifier.task_limits import TaskLimits
from verifier.tasks import Task


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


@dataclass
class StepPrompts:
    """How a step words its prompts and bounds its tasks.

    ``prompter`` renders the style; its tokenizer (when present) counts tokens for the budget and
    the token limits. ``budget`` = ``max_seq_len - max_tokens`` is the most tokens a prompt may
    have so that prompt + ``max_tokens`` fits the context.
    """

    prompter: Prompter
    limits: TaskLimits
    max_seq_len: int
    max_tokens: int

    @classmethod
    def from_config(cls, config: Config, model_path: str | Path | None = None, tokenizer: Any = None) -> "StepPrompts":
        """Build from ``config``, loading the tokenizer of ``model_path`` unless one is given.

        Raises :class:`PromptStyleError` for a ``chat`` style on a model without a chat template and
        ``ValueError`` when ``inference.max_tokens`` leaves no room for a prompt in ``model.max_seq_len``.
        """
        if config.inference.max_tokens >= config.model.max_seq_len:
            raise ValueError(
                f"inference.max_tokens={config.inference.max_tokens} leaves no room for a prompt in "
                f"model.max_seq_len={config.model.max_seq_len}; lower max_tokens or raise max_seq_len"
            )
        if tokenizer is None and model_path is not None:
            tokenizer = load_tokenizer(model_path)
        limits = TaskLimits.from_config(config.tasks, config.verifier.max_output_chars)
        rules = TaskRules(limits, config.verifier.timeout_s, config.verifier.memory_mb, config.tasks.code_f_inputs)
        prompter = Prompter(config.tasks.prompt_style, rules, tokenizer, source=str(model_path or "the model"))
        return cls(prompter, limits, config.model.max_seq_len, config.inference.max_tokens)

    @property
    def budget(self) -> int:
        return self.max_seq_len - self.max_tokens

    def count_tokens(self, text: str) -> int | None:
        """Tokens of ``text`` as the engine counts them, or None without a tokenizer."""
        return self.prompter.count_tokens(text) if self.prompter.tokenizer is not None else None

    @property
    def token_counter(self) -> Any:
        """``count_tokens`` when a tokenizer is present, else None (limits are then in characters only)."""
        return self.prompter.count_tokens if self.prompter.tokenizer is not None else None


def load_tokenizer(model_path: str | Path) -> Any:
    """The model's tokenizer (what the engine tokenizes prompts with), from its local directory."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_path))
    except (OSError, ValueError) as err:
        raise PromptStyleError(f"cannot load the tokenizer of {model_path}: {err}") from err


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
                           behaviour_logprobs=s.logprobs if tis else None, fixed_advantage=s.fixed_advantage)
             for s in kept]
    return batch, extra


def proposal_jobs(
    pairs: Sequence[tuple[str, str]],
    families: Sequence[str],
    tasks_per_teacher: int,
    references: dict[str, list[list[Task]]],
    n_inputs: int,
    prompts: StepPrompts | None = None,
) -> list[ProposalJob]:
    """Proposal prompts for each (teacher, student) pair; ``references[family]`` is consumed in order
    (one list of K tasks per prompt of that family, sampled by the league's buffers).

    With ``prompts`` the prompt is in its style and references are dropped (longest first) until it
    fits the prompt budget; without, it is the compact prompt with every reference.
    """
    jobs = []
    cursor = {family: 0 for family in families}
    for teacher, student in pairs:
        for i in range(tasks_per_teacher):
            family = families[i % len(families)]
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


def reference_counts(pairs: Sequence[tuple[str, str]], families: Sequence[str], tasks_per_teacher: int) -> dict[str, int]:
    """How many reference lists :func:`proposal_jobs` consumes per family."""
    counts = {family: 0 for family in families}
    for _ in pairs:
        for i in range(tasks_per_teacher):
            counts[families[i % len(families)]] += 1
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


def prompt_metrics(proposals: Sequence[ProposalJob], solves: Sequence[SolveJob], dropped: Sequence[DroppedRequest],
                   prompts: StepPrompts) -> dict[str, Any]:
    """The step's prompt sizes against the budget, references trimmed, and requests dropped (with reasons)."""
    lengths = [len(j.generation.prompt_token_ids) for j in proposals if j.generation is not None]
    lengths += [len(g.prompt_token_ids) for s in solves for g in s.generations[:1]]
    reasons: dict[str, int] = {}
    for d in dropped:
        reasons[d.reason] = reasons.get(d.reason, 0) + 1
    return {
        "tokens": role_tokens(proposals, solves),
        "prompt_style": prompts.prompter.style,
        "prompt_budget": prompts.budget,
        "prompt_tokens_max": max(lengths, default=0),
        "references_dropped": sum(j.references_dropped for j in proposals),
        "dropped_requests": {"teacher": sum(d.role == "teacher" for d in dropped),
                             "student": sum(d.role == "student" for d in dropped)},
        "dropped_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:5]),
    }


def role_tokens(proposals: Sequence[ProposalJob], solves: Sequence[SolveJob]) -> dict[str, dict[str, int]]:
    """Per role: sequences generated and their prompt and completion tokens (what the time plan's lengths are)."""
    teacher = [j.generation for j in proposals if j.generation is not None]
    student = [g for s in solves for g in s.generations]
    return {role: {"sequences": len(gens), "prompt": sum(len(g.prompt_token_ids) for g in gens),
                   "completion": sum(len(g.token_ids) for g in gens)}
            for role, gens in (("teacher", teacher), ("student", student))}


def solve_rates(n_proposals: int, solves: Sequence[SolveJob], judgements: Sequence[Sequence[Any]]) -> list[float | None]:
    """rho per proposal: the fraction of its rollouts judged correct (None for an invalid proposal)."""
    rho: list[float | None] = [None] * n_proposals
    for job, verdicts in zip(solves, judgements):
        rho[job.proposal] = sum(bool(v.correct) for v in verdicts) / max(1, len(verdicts))
    return rho


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
