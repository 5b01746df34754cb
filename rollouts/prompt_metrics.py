"""The step's prompt sizes against the budget, the references trimmed and the requests dropped (pure, no Ray)."""

from __future__ import annotations

from typing import Any, Sequence

from rollouts.jobs import DroppedRequest, ProposalJob, SolveJob
from rollouts.step_prompts import StepPrompts


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
