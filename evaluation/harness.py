"""One engine pass per benchmark for many models (adapters and the base) in mixed-adapter batches.

``evaluate`` sends every (problem, model) request of a benchmark to the engine in one
``generate`` call (the engine batches rows of different adapters together), then judges the
answers: code in the sandbox (``code_judge``), math with ``math_grade``. ``oracle`` judges the
reference solutions instead (no engine): a check of the data and the harness.

A model's score on a benchmark: with n samples per problem and c correct, pass@k (``passk``) for
every k in {1, 5, 10, ...} up to n, averaged over problems.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from inference.requests import GenerationRequest
from evaluation.code_judge import CodeJudge, Outcome
from evaluation.datasets import CodeProblem, MathProblem, Problem
from evaluation.math_grade import MathGrader, extract_answer
from evaluation.passk import mean_pass_at_k
from evaluation.prompts import code_for, render, user_text


@dataclass(frozen=True)
class ModelSpec:
    """One evaluated model: ``adapter`` is the engine's adapter name (None: the base);
    ``group`` is ``population``, ``base`` or ``compare``."""

    label: str
    adapter: str | None
    group: str


@dataclass(frozen=True)
class Decoding:
    samples: int = 1
    temperature: float = 0.0  # greedy unless samples > 1
    max_tokens: int = 512
    seed: int = 0


def ks_for(samples: int) -> list[int]:
    return [k for k in (1, 5, 10, 20, 50, 100) if k <= samples]


def _score(problems: Sequence[Problem], outcomes: list[list[Outcome]], samples: int, responses: list[list[str]] | None) -> dict[str, Any]:
    counts = [(len(o), sum(x.passed for x in o)) for o in outcomes]
    out: dict[str, Any] = {f"pass@{k}": mean_pass_at_k(counts, k) for k in ks_for(samples)}
    has_base = any(x.base_passed is not None for o in outcomes for x in o)
    if has_base:  # evalplus: pass@k above is the plus score (base and plus inputs); this is base only
        base_counts = [(len(o), sum(bool(x.base_passed) for x in o)) for o in outcomes]
        out.update({f"base_pass@{k}": mean_pass_at_k(base_counts, k) for k in ks_for(samples)})
    out["n"] = len(problems)
    out["samples"] = samples
    out["data_errors"] = sorted({p.task_id for p, o in zip(problems, outcomes) for x in o if x.reason.startswith("data error")})
    out["tasks"] = [
        {"task_id": p.task_id, "passed": [x.passed for x in o], "reasons": [x.reason for x in o],
         **({"base_passed": [x.base_passed for x in o]} if has_base else {}),
         **({"responses": [r[:2000] for r in responses[i]]} if responses is not None else {})}
        for i, (p, o) in enumerate(zip(problems, outcomes))
    ]
    return out


def judge_answers(problems: Sequence[Problem], answers: list[list[str]], judge: CodeJudge | None, grader: MathGrader | None) -> list[list[Outcome]]:
    """Outcomes for ``answers[i]`` (the samples of problem i), every code run batched at once."""
    outcomes: list[list[Outcome]] = [[] for _ in problems]
    code_items: list[tuple[CodeProblem, str | None]] = []
    where: list[int] = []
    for i, (p, texts) in enumerate(zip(problems, answers)):
        for text in texts:
            if isinstance(p, MathProblem):
                ok, reason = grader.grade(p.answer, extract_answer(text))
                outcomes[i].append(Outcome(ok, reason))
            else:
                code_items.append((p, code_for(p, text)))
                where.append(i)
    if code_items:
        for i, outcome in zip(where, judge.judge(code_items)):
            outcomes[i].append(outcome)
    return outcomes


def oracle(problems: Sequence[Problem], judge: CodeJudge | None, grader: MathGrader | None) -> dict[str, Any]:
    """Score the reference solutions (problems without one, e.g. LiveCodeBench, are skipped)."""
    kept: list[Problem] = []
    answers: list[list[str]] = []
    for p in problems:
        if isinstance(p, MathProblem):
            answers.append([f"<answer>\\boxed{{{p.answer}}}</answer>"])
        elif p.reference is not None:
            answers.append([f"```python\n{p.reference}\n```"])
        else:
            continue
        kept.append(p)
    result = _score(kept, judge_answers(kept, answers, judge, grader), 1, None)
    result["skipped_without_reference"] = len(problems) - len(kept)
    return result


def evaluate(
    engine: Any,
    problems: Sequence[Problem],
    models: Sequence[ModelSpec],
    style: str,
    tokenizer: Any,
    decoding: Decoding,
    judge: CodeJudge | None,
    grader: MathGrader | None,
    keep_responses: bool = True,
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Scores of every model on one benchmark from ONE ``engine.generate`` call; also timings."""
    prompts = [render(style, user_text(p), tokenizer) for p in problems]
    temperature = decoding.temperature if decoding.samples > 1 else 0.0
    requests = [
        GenerationRequest(adapter=m.adapter, prompt=prompt, temperature=temperature, max_tokens=decoding.max_tokens,
                          n=decoding.samples, seed=decoding.seed)
        for m in models for prompt in prompts
    ]
    start = time.perf_counter()
    generations = engine.generate(requests)
    generate_s = time.perf_counter() - start
    texts = [[g.text if not g.rejected else f"[rejected by the engine: {g.error}]" for g in gens] for gens in generations]
    start = time.perf_counter()
    all_outcomes = judge_answers(list(problems) * len(models), texts, judge, grader)
    judge_s = time.perf_counter() - start
    scores: dict[str, dict[str, Any]] = {}
    for j, m in enumerate(models):
        block = slice(j * len(problems), (j + 1) * len(problems))
        scores[m.label] = _score(problems, all_outcomes[block], decoding.samples, texts[block] if keep_responses else None)
    rejected = sum(g.rejected for gens in generations for g in gens)
    return scores, {"generate_s": generate_s, "judge_s": judge_s, "engine_passes": 1, "requests": len(requests), "rejected": rejected}
