"""The expected lengths both plans read: tokens per sequence of each role and the valid fraction of proposals.

From the config (``plan.*``, :func:`lengths_from_config`) or a finished run's ``metrics.jsonl``
(:func:`lengths_from_run`, ``launch.py --dry-run --from-run``). The time plan turns them into work
(``planning.time_plan``); the memory plan sizes each vLLM replica's decode concurrency from them
(``planning.memory_plan.PagedKV``). Pure arithmetic: no Ray, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Lengths:
    """Expected tokens per sequence and the expected valid fraction of proposals."""

    propose_prompt: int
    proposal: int
    solve_prompt: int
    answer: int
    valid_fraction: float
    source: str = "config (plan.*)"


def lengths_from_config(config: Any) -> Lengths:
    """The ``plan.*`` expected lengths (sane defaults for a 7B model with r1 prompts; the tiny presets set theirs)."""
    p = config.plan
    return Lengths(p.propose_prompt_tokens, min(p.proposal_tokens, config.inference.max_tokens), p.solve_prompt_tokens,
                   min(p.answer_tokens, config.inference.max_tokens), p.valid_fraction)


class RunRecordError(ValueError):
    """A run directory whose ``metrics.jsonl`` cannot give the plan its lengths."""


def lengths_from_run(rows: list[dict[str, Any]], source: str) -> Lengths:
    """Mean tokens per sequence of each role and the mean valid rate over a run's step rows (``tokens`` records)."""
    steps = [r for r in rows if "tokens" in r and "step" in r]
    if not steps:
        raise RunRecordError(f"{source}: no step row records token counts ('tokens'); runs record them from this "
                             "version on, so replan from a run made with it")

    def mean(role: str, part: str) -> float:
        seqs = sum(r["tokens"][role]["sequences"] for r in steps)
        return sum(r["tokens"][role][part] for r in steps) / seqs if seqs else 0.0

    valid = sum(r.get("valid_rate", 0.0) for r in steps) / len(steps)
    return Lengths(max(1, round(mean("teacher", "prompt"))), max(1, round(mean("teacher", "completion"))),
                   max(1, round(mean("student", "prompt"))), max(1, round(mean("student", "completion"))),
                   max(valid, 1e-3), f"{source} ({len(steps)} steps)")


def sequence_tokens(config: Any, lengths: Lengths) -> dict[str, int]:
    """Expected tokens of one sequence (prompt + new) in each generation phase of a step: ``propose`` and ``solve``,
    and with ``eval.every`` ``evaluate`` (a prompt of the students' expected length and ``eval.max_tokens`` new tokens:
    the time plan decodes every benchmark answer to its end)."""
    out = {"propose": lengths.propose_prompt + lengths.proposal, "solve": lengths.solve_prompt + lengths.answer}
    if config.eval.every:
        out["evaluate"] = lengths.solve_prompt + config.eval.max_tokens
    return out


__all__ = ["Lengths", "RunRecordError", "lengths_from_config", "lengths_from_run", "sequence_tokens"]
