"""What one step does with text: prompts in, rewards and training samples out (pure, no Ray).

The loop (``actors.loop``) calls these between the actor calls; each lives in a module named for what it holds:

- ``rollouts.step_prompts``: :class:`StepPrompts`, how a step words its prompts and bounds its tasks;
- ``rollouts.jobs``: the proposal and solve jobs, the parsed and size-bounded validations, dropped requests, rho;
- ``rollouts.rewards``: the game's rewards (teacher, student, the single agent's learnability);
- ``rollouts.samples``: :class:`Sample`, the completions with their rewards and a learner's view of them;
- ``rollouts.hindsight``: the optional supervised targets of the students (``rl.hindsight_coef``);
- ``rollouts.prompt_metrics``: the prompt sizes, trimmed references and dropped requests of a step's row.
"""

from rollouts.jobs import (
    DroppedRequest,
    ProposalJob,
    SolveJob,
    bounded_validations,
    drop_rejected_proposals,
    drop_rejected_solves,
    judge_items,
    parsed_proposals,
    proposal_jobs,
    reference_counts,
    solve_jobs,
    solve_rates,
    student_prompt_of,
    teacher_families,
    truncated,
)
from rollouts.prompt_metrics import prompt_metrics, role_tokens
from rollouts.samples import (
    LOGPROB_SLACK,
    Sample,
    advantage_group,
    behaviour_problem,
    learner_samples,
    mark_kl_readout,
    split_by_behaviour,
    student_samples,
    teacher_samples,
)
from rollouts.step_prompts import StepPrompts, load_tokenizer

__all__ = [
    "LOGPROB_SLACK", "DroppedRequest", "ProposalJob", "Sample", "SolveJob", "StepPrompts", "advantage_group",
    "behaviour_problem", "bounded_validations", "drop_rejected_proposals", "drop_rejected_solves", "judge_items",
    "learner_samples", "load_tokenizer", "mark_kl_readout", "parsed_proposals", "prompt_metrics", "proposal_jobs", "reference_counts",
    "role_tokens", "solve_jobs", "solve_rates", "split_by_behaviour", "student_prompt_of", "student_samples",
    "teacher_families", "teacher_samples", "truncated",
]
