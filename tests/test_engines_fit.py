"""A request that does not fit the context fails alone: its n results say why, the rest of the batch runs
exactly as it would without it. The check is in the shared engine code, before any backend call, so it holds
for the vLLM backend too (shown here without vLLM installed: the backend is never reached)."""

from __future__ import annotations

import pytest

from inference import GenerationRequest, make_engine
from inference.base import EngineBase
from inference.vllm_engine import VLLMEngine

MAX_LEN = 256


@pytest.fixture(scope="module")
def engine(tiny_qwen2):
    eng = make_engine("hf", tiny_qwen2, max_adapters=1, max_lora_rank=8, max_model_len=MAX_LEN)
    yield eng
    eng.close()


def prompt_of(engine, tokens: int) -> str:
    """A prompt that tokenizes to exactly ``tokens`` tokens."""
    ids = engine.tokenizer("def f(a):\n    return a\n" * 200, add_special_tokens=False)["input_ids"]
    for cut in range(tokens, tokens + 8):
        text = engine.tokenizer.decode(ids[:cut])
        if len(engine.tokenizer(text, add_special_tokens=False)["input_ids"]) == tokens:
            return text
    raise AssertionError(f"no prompt of exactly {tokens} tokens")


def request(prompt: str, max_tokens: int = 8, n: int = 1, seed: int = 7) -> GenerationRequest:
    return GenerationRequest(None, prompt, temperature=1.0, max_tokens=max_tokens, n=n, seed=seed)


def test_over_long_requests_fail_alone_and_the_batch_runs(engine):
    short = request("def f(a):", max_tokens=8, n=2, seed=11)
    exact = request(prompt_of(engine, MAX_LEN - 8), max_tokens=8, seed=12)  # prompt + max_tokens == context: fits
    over_budget = request(prompt_of(engine, MAX_LEN - 8), max_tokens=9, n=3)  # one token too many
    over_context = request(prompt_of(engine, MAX_LEN + 20), max_tokens=1)  # the prompt alone is too long
    out = engine.generate([short, over_budget, exact, over_context])
    assert [len(gens) for gens in out] == [2, 3, 1, 1]
    for gens, needed in ((out[1], MAX_LEN + 1), (out[3], MAX_LEN + 21)):
        for g in gens:
            assert g.rejected and g.finish_reason == "rejected" and g.token_ids == [] and g.text == ""
            assert f"{needed} tokens in all, over max_model_len={MAX_LEN}" in g.error
    assert not any(g.rejected for g in out[0] + out[2]) and all(g.error is None for g in out[0] + out[2])
    assert len(out[2][0].token_ids) == 8 or out[2][0].finish_reason == "stop"
    alone = engine.generate([short, exact])  # the rejected ones changed nothing for the others
    assert [[g.token_ids for g in gens] for gens in alone] == [[g.token_ids for g in gens] for gens in (out[0], out[2])]
    (alone_rejected,) = engine.generate([over_context])[0]  # a batch of only rejected requests never reaches the backend
    assert alone_rejected.rejected and alone_rejected.error.startswith("request 0 does not fit the context")


def test_the_vllm_backend_rejects_before_calling_vllm(engine):
    """VLLMEngine shares EngineBase.generate: an over-long request is answered without vLLM (not installed here)."""
    assert VLLMEngine.generate is EngineBase.generate
    backend = VLLMEngine.__new__(VLLMEngine)
    EngineBase.__init__(backend, engine.tokenizer, MAX_LEN, max_adapters=1, max_lora_rank=8)
    (gens,) = backend.generate([request(prompt_of(engine, MAX_LEN), max_tokens=4, n=2)])
    assert [g.finish_reason for g in gens] == ["rejected", "rejected"]
    assert f"{MAX_LEN + 4} tokens in all, over max_model_len={MAX_LEN}" in gens[0].error
