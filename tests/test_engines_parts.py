"""Unit tests of the engine parts that need no model: sampling, stop strings, the adapter store, request checks."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.adapter_store import AdapterStore, ram_backed_root, read_adapter_spec
from inference.base import cut_at_stop, sample_seed
from inference.requests import AdapterLoadError, GenerationRequest, InvalidRequestError
from inference.sampling import sample_tokens


def generators(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def draw(logits: list[float], temperature: float, top_p: float, draws: int, seed: int = 0) -> torch.Tensor:
    """``draws`` tokens from one distribution (one row per draw, each with its own generator)."""
    rows = torch.tensor([logits] * draws)
    tokens, _ = sample_tokens(rows, torch.full((draws,), temperature), torch.full((draws,), top_p),
                              generators(*range(seed, seed + draws)))
    return tokens


def nucleus_logprob(logits: list[float], temperature: float, top_p: float, token: int) -> float:
    """log p(token) under softmax(z / T) cut to the top-p nucleus and renormalised, computed plainly in float64."""
    z = [x / temperature for x in logits]
    top = max(z)
    p = [math.exp(x - top) for x in z]
    total = sum(p)
    p = [x / total for x in p]
    kept, before = set(), 0.0
    for v in sorted(range(len(p)), key=lambda v: -p[v]):
        if before >= top_p:
            break
        kept.add(v)
        before += p[v]
    assert token in kept, "the sampled token must be in the nucleus"
    return math.log(p[token] / sum(p[v] for v in kept))


def test_greedy_rows_take_the_argmax_with_logprob_zero():
    """Greedy decoding samples from the point mass on the argmax: log 1 = 0, whatever top_p."""
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    tokens, logprobs = sample_tokens(logits, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.5]), generators(0, 1))
    assert tokens.tolist() == [1, 0]
    assert logprobs.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("temperature, top_p", [(0.3, 0.5), (0.6, 0.9), (1.0, 1.0), (1.7, 0.95)])
def test_logprobs_are_those_of_the_sampling_distribution(temperature, top_p):
    """The returned log-prob is log p_{T,P}(token): tempered, cut to the nucleus, renormalised over it."""
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(3)) * 3
    tokens, logprobs = sample_tokens(logits, torch.full((64,), temperature), torch.full((64,), top_p),
                                     generators(*range(64)))
    expected = [nucleus_logprob(logits[i].tolist(), temperature, top_p, int(tokens[i])) for i in range(64)]
    assert logprobs.tolist() == pytest.approx(expected, abs=1e-5)
    if top_p < 1.0:  # the nucleus renormalisation matters here: above the tempered log-softmax
        tempered = torch.log_softmax(logits / temperature, -1).gather(1, tokens[:, None]).squeeze(1)
        assert bool((logprobs > tempered + 1e-4).any())


def test_mixed_rows_each_get_their_own_distribution():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    temperature, top_p = torch.tensor([0.0, 0.5, 1.0]), torch.tensor([0.9, 0.8, 1.0])
    tokens, logprobs = sample_tokens(logits, temperature, top_p, generators(0, 1, 2))
    assert logprobs[0] == 0.0 and tokens[0] == logits[0].argmax()
    for i in (1, 2):
        assert logprobs[i].item() == pytest.approx(
            nucleus_logprob(logits[i].tolist(), float(temperature[i]), float(top_p[i]), int(tokens[i])), abs=1e-5)


def test_sampling_frequencies_follow_temperature_and_the_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 4000
    # top_p = 0.7: tokens 0 and 1 have mass before them 0 and 0.5 (< 0.7); token 2 has 0.8 -> cut.
    tokens = draw(probs.log().tolist(), 1.0, 0.7, n)
    assert set(tokens.tolist()) == {0, 1}
    assert abs((tokens == 0).float().mean().item() - 0.5 / 0.8) < 0.03  # ~4 standard errors
    # T = 0.5 squares the probabilities: p ~ p^2 / sum p^2.
    tokens = draw(probs.log().tolist(), 0.5, 1.0, n, seed=10_000)
    expected = probs**2 / (probs**2).sum()
    observed = torch.bincount(tokens, minlength=4).float() / n
    assert torch.allclose(observed, expected, atol=0.03)


def test_a_seeded_row_draws_the_same_token_whatever_its_neighbours():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(0))
    temperature, top_p = torch.ones(4), torch.ones(4)
    first, _ = sample_tokens(logits, temperature, top_p, generators(5, 6, 7, 8))
    shuffled, _ = sample_tokens(logits[[2, 0]], temperature[:2], top_p[:2], generators(7, 5))
    assert shuffled.tolist() == [first[2].item(), first[0].item()]


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.floats(-20, 20), min_size=2, max_size=40),
    temperature=st.floats(0.05, 5.0),
    top_p=st.floats(1e-4, 1.0),
    seed=st.integers(0, 2**31),
)
def test_sampled_token_is_always_inside_the_nucleus(logits, temperature, top_p, seed):
    z = torch.tensor([logits])
    (token,), _ = sample_tokens(z, torch.tensor([temperature]), torch.tensor([top_p]), generators(seed))
    p = torch.softmax(z[0] / temperature, -1)
    mass_before = p[p > p[token]].sum().item()  # mass of strictly more probable tokens
    assert p[token] > 0
    assert mass_before < top_p + 1e-5


def test_cut_at_stop_uses_the_earliest_stop():
    assert cut_at_stop("abc</answer>def\n", ["\n", "</answer>"]) == ("abc", True)
    assert cut_at_stop("abc", ["x"]) == ("abc", False)
    assert cut_at_stop("xabc", ["x"]) == ("", True)


def test_sample_seeds_follow_vllm():
    assert [sample_seed(10, j) for j in range(3)] == [10, 11, 12]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(prompt=""), "prompt"),
        (dict(adapter=""), "adapter"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_tokens=2.5), "max_tokens"),
        (dict(n=-1), "n must"),
        (dict(seed=-3), "seed"),
        (dict(stop=["ok", ""]), "stop"),
    ],
)
def test_request_checks_name_the_bad_field(kwargs, words):
    request = GenerationRequest(**{"adapter": None, "prompt": "x", **kwargs})
    with pytest.raises(InvalidRequestError, match=words):
        request.check()


def write_adapter(path: Path, **config) -> Path:
    path.mkdir(parents=True)
    base = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    (path / "adapter_config.json").write_text(json.dumps({**base, **config}))
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    return path


def test_adapter_spec_reads_rank_alpha_and_scaling(tmp_path):
    spec = read_adapter_spec(write_adapter(tmp_path / "a", lora_alpha=32, use_rslora=True), max_rank=16)
    assert (spec.rank, spec.target_modules) == (8, ("q_proj", "v_proj"))
    assert math.isclose(spec.scaling, 32 / math.sqrt(8))


@pytest.mark.parametrize(
    "config, words",
    [
        (dict(r=32), "rank 32 exceeds the engine's max_lora_rank 16"),
        (dict(r=0), "rank"),
        (dict(target_modules="q_proj|v_proj"), "regex"),
        (dict(peft_type="IA3"), "LORA"),
        (dict(use_dora=True), "DoRA"),
    ],
)
def test_adapter_spec_rejects_what_cannot_load(tmp_path, config, words):
    with pytest.raises(AdapterLoadError, match=words):
        read_adapter_spec(write_adapter(tmp_path / "a", **config), max_rank=16)


def test_adapter_spec_rejects_missing_files(tmp_path):
    path = write_adapter(tmp_path / "a")
    (path / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterLoadError, match="adapter_model.safetensors"):
        read_adapter_spec(path, max_rank=8)
    (path / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterLoadError):
        read_adapter_spec(path, max_rank=8)
    shutil.rmtree(path)
    with pytest.raises(AdapterLoadError, match="not a directory"):
        read_adapter_spec(path, max_rank=8)


def test_store_gives_every_version_its_own_directory_and_cleans_up(tmp_path):
    source = write_adapter(tmp_path / "src")
    store = AdapterStore(root=tmp_path)
    first = store.publish("t0", source, 3)
    again = store.publish("t0", source, 3)  # same version republished: still a new path
    assert first != again and first.parent == again.parent == store.root / "t0"
    assert (first / "adapter_config.json").read_text() == (source / "adapter_config.json").read_text()
    store.discard(first)
    assert store.live_versions() == [again]
    store.close()
    assert not store.root.exists()


def test_store_lives_in_ram_where_there_is_a_ram_disk(tmp_path, monkeypatch):
    monkeypatch.delenv("POPULORA_SHM_DIR", raising=False)
    expected = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    assert ram_backed_root() == expected
    monkeypatch.setenv("POPULORA_SHM_DIR", str(tmp_path))  # another RAM-backed directory, named by the user
    store = AdapterStore()
    assert ram_backed_root() == tmp_path and store.root.parent == tmp_path
    store.close()
    monkeypatch.setenv("POPULORA_SHM_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="POPULORA_SHM_DIR=.*missing is not a directory"):
        ram_backed_root()
