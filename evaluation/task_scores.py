"""Scoring a model's students on a task set: per task the answers judged correct (the held-out probes of the studies
and the tiny model's bench)."""

from __future__ import annotations

from inference.requests import GenerationRequest
from verifier.families import judge_answers
from verifier.prompts import student_prompt
from verifier.sandbox import Verifier


def task_scores(engine, adapter: str | None, tasks: list, samples: int, temperature: float, max_tokens: int,
                verifier: Verifier) -> list[int]:
    """Per task the number of its ``samples`` answers judged correct (seeded per task: the same draws for every model)."""
    requests = [GenerationRequest(adapter, student_prompt(t), temperature=temperature, max_tokens=max_tokens, n=samples,
                                  seed=1000 + 64 * i)
                for i, t in enumerate(tasks)]
    outputs = engine.generate(requests)
    answers = [(t, g.text) for t, gens in zip(tasks, outputs) for g in gens]
    verdicts = judge_answers(verifier, answers)
    return [sum(bool(v.correct) for v in verdicts[i * samples:(i + 1) * samples]) for i in range(len(tasks))]
