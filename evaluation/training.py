"""Benchmark evaluation during training: every ``eval.every`` steps, every member and the base.

``TrainingEvaluator`` reads ``eval.benchmarks`` once (the first ``eval.limit`` problems of each),
then at a due step sends every (problem, model) request of a benchmark through the run's own
``generate`` (the inference actors, in mixed-adapter batches; members' adapters are already live
there under their names) and judges the answers like ``python -m evaluation`` (sandbox for code,
Math-Verify for math). It returns metrics-row entries ``eval/<benchmark>/<member>`` (greedy
pass@1), ``eval/<benchmark>/base`` and ``eval/<benchmark>/population_mean``. No Ray here: the
driver passes ``System.generate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from configs import Config
from evaluation.code_judge import CodeJudge, JudgeLimits
from evaluation.datasets import MATH_BENCHMARKS, BenchmarkFileError, find_file, load_benchmark
from evaluation.harness import Decoding, ModelSpec, evaluate
from evaluation.math_grade import MathGrader


class _GenerateOnly:
    """What ``harness.evaluate`` needs of an engine: ``generate(requests)``."""

    def __init__(self, generate: Callable[[list[Any]], list[list[Any]]]):
        self.generate = generate


class TrainingEvaluator:
    def __init__(self, config: Config, model_path: str | Path, tokenizer: Any = None):
        cfg = config.eval
        if not cfg.benchmarks:
            raise BenchmarkFileError("eval.every is set but eval.benchmarks is empty")
        self.every = cfg.every
        self.benchmarks: dict[str, list[Any]] = {}
        for item in cfg.benchmarks:
            name, _, path = item.partition("=")
            if path:
                paths = [Path(path)]
            elif cfg.data is None:
                raise BenchmarkFileError(f"eval.benchmarks has {name!r} but no file: set eval.data or write {name}=PATH")
            else:
                paths = find_file(Path(cfg.data), name)
            problems = load_benchmark(name, paths)
            self.benchmarks[name] = problems[: cfg.limit] if cfg.limit else problems
        self.style = "chat" if config.tasks.prompt_style == "chat" else "r1"
        self.tokenizer = tokenizer
        if self.style == "chat" and tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.decoding = Decoding(samples=1, max_tokens=cfg.max_tokens, seed=config.run.seed)
        self.judge = CodeJudge(JudgeLimits())
        self.grader = MathGrader() if any(b in MATH_BENCHMARKS for b in self.benchmarks) else None

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def __call__(self, generate: Callable[[list[Any]], list[list[Any]]], members: Sequence[str]) -> dict[str, float]:
        """Metrics-row entries for every member and the base; one generate call per benchmark."""
        models = [ModelSpec(m, m, "population") for m in members] + [ModelSpec("base", None, "base")]
        row: dict[str, float] = {}
        for name, problems in self.benchmarks.items():
            scores, _ = evaluate(_GenerateOnly(generate), problems, models, self.style, self.tokenizer, self.decoding,
                                 self.judge, self.grader, keep_responses=False)
            for label, score in scores.items():
                row[f"eval/{name}/{label}"] = score["pass@1"]
            row[f"eval/{name}/population_mean"] = sum(scores[m]["pass@1"] for m in members) / max(1, len(members))
        return row

    def close(self) -> None:
        self.judge.close()
        if self.grader is not None:
            self.grader.close()
