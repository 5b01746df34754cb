"""Regression (issue 20): seeded requests whose prompts do not fit one scheduler step, on vLLM's CPU build.

vLLM 0.32's model runner rewinds a seeded request's ``torch.Generator`` after a step that only
prefilled part of its prompt (``gen.set_offset(gen.get_offset() - 4)`` in ``_bookkeeping_sync``): the
token sampled there is discarded. CUDA (Philox) generators have an offset; CPU (Mersenne Twister)
generators do not, and the call raises ``RuntimeError: CPU Generator does not use offset``. With
chunked prefill on (vLLM's default) a batch whose prompts exceed ``max_num_batched_tokens`` (4,096 on
CPU) splits the prompt at the budget boundary, which is what crashed the system's student batches
after an evolution event. The backend turns chunked prefill off on CPU, so every prompt is prefilled
in one step; this test sends such a batch through the real engine, with a 512-token budget (as
4,096 but quicker).

    OMP_NUM_THREADS=1 /opt/venv-vllm/bin/python -m pytest tests/test_vllm_seeded_prefill.py -q
"""

from __future__ import annotations

import pytest

from inference import GenerationRequest, make_engine, vllm_available

pytestmark = pytest.mark.vllm

MAX_LEN = 256
PROMPT_TOKENS = 200
BUDGET = 512  # max_num_batched_tokens: tokens one scheduler step may compute
REQUESTS = 8  # x n=2 x 200 tokens = 3,200 prompt tokens: several steps' budget
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def engine(tiny_qwen2):
    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    mp = pytest.MonkeyPatch()
    # Its own engine-core process: another in-process vLLM engine in this pytest process (tests/test_engines.py)
    # shares process-global state that closing this one would tear down.
    import vllm.envs

    mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    mp.setattr(vllm.envs, "__getattr__", getattr(vllm.envs.__getattr__, "__wrapped__", vllm.envs.__getattr__))
    eng = make_engine("vllm", tiny_qwen2, max_adapters=1, max_lora_rank=8, max_model_len=MAX_LEN,
                      engine_args={"max_num_batched_tokens": BUDGET})
    yield eng
    eng.close()
    mp.undo()


def prompts(engine, count: int, tokens: int) -> list[str]:
    """``count`` different prompts of at least ``tokens`` tokens each."""
    base = engine.tokenizer("def f(a):\n    return a + 1\n" * 100, add_special_tokens=False)["input_ids"]
    out = []
    for i in range(count):
        text = f"# case {i}\n" + engine.tokenizer.decode(base[:tokens])
        assert tokens <= len(engine.tokenizer(text, add_special_tokens=False)["input_ids"]) < MAX_LEN - MAX_TOKENS
        out.append(text)
    return out


def test_seeded_batch_longer_than_one_step_runs_and_matches_each_request_alone(engine):
    assert engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens == BUDGET
    batch = [GenerationRequest(None, p, temperature=1.0, max_tokens=MAX_TOKENS, n=2, seed=1000 + 2 * i)
             for i, p in enumerate(prompts(engine, REQUESTS, PROMPT_TOKENS))]
    assert REQUESTS * 2 * PROMPT_TOKENS > BUDGET  # the batch's prompts cannot be prefilled in one step
    out = engine.generate(batch)
    assert [len(gens) for gens in out] == [2] * REQUESTS
    assert all(g.token_ids and g.finish_reason in ("stop", "length") for gens in out for g in gens)
    for i in (0, REQUESTS // 2, REQUESTS - 1):  # a seeded request samples the same alone as in the big batch
        (alone,) = engine.generate([batch[i]])
        assert [g.token_ids for g in alone] == [g.token_ids for g in out[i]]
