"""A build that continues a variant's finished model (``BuildSettings.continues``, as ``stronger-large-plus``):
it starts from that model's weights, has a key of its own that follows the model it continues, and is refused when
anything but its training settings differ."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
import torch
from safetensors.torch import load_file

from tinycoder import build_here, ensure_model, model_dir
from tinycoder.build import load_start
from tinycoder.cache import MANIFEST, cache_key
from tinycoder.model import new_model
from tinycoder.settings import VARIANTS, continued_settings, data_seed, describe, variant_settings
from tinycoder.shipped import portable_key
from test_tinycoder_build import MICRO  # 40 programs, 4 steps: seconds


def weights(directory) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


@pytest.fixture
def micro_variants(monkeypatch):
    """``micro`` and two continuations of it: one at learning rate 0 (its steps change nothing), one that trains."""
    monkeypatch.setitem(VARIANTS, "micro", MICRO)
    monkeypatch.setitem(VARIANTS, "micro-still", replace(MICRO, continues="micro", train=replace(MICRO.train, lr=0.0, steps=2)))
    monkeypatch.setitem(VARIANTS, "micro-more", replace(MICRO, continues="micro", train=replace(MICRO.train, steps=3)))


def test_a_continuation_builds_the_model_it_continues_and_starts_from_its_weights(tmp_path, micro_variants, capfd):
    still = build_here("micro-still", cache_dir=tmp_path, threads=1)
    parent = model_dir("micro", cache_dir=tmp_path)
    assert (parent / MANIFEST).is_file(), "the model it continues is built first, into the same cache"
    err = capfd.readouterr().err
    assert f"continuing the 'micro' model in {parent}" in err
    start, after = weights(parent), weights(still)
    assert start.keys() == after.keys()
    assert all(torch.equal(start[name], after[name]) for name in start), "at lr 0 the weights are the parent's"

    more = build_here("micro-more", cache_dir=tmp_path, threads=1)
    trained = weights(more)
    assert any(not torch.equal(start[name], trained[name]) for name in start), "a continuation that trains moves"
    manifest = json.loads((more / MANIFEST).read_text())
    assert manifest["continues"]["variant"] == "micro"
    assert manifest["continues"]["key"] == parent.name.removeprefix("micro-")
    assert (tmp_path / f"{more.name}.progress").exists() is False  # its saved progress goes once it is in place


def test_a_continuations_key_is_its_own_and_follows_the_model_it_continues(micro_variants, monkeypatch):
    more = variant_settings("micro-more")
    key = cache_key(describe(more, 0))
    assert key != cache_key(describe(MICRO, 0))
    assert describe(more, 0)["settings"]["continues"] == {"variant": "micro", "key": cache_key(describe(MICRO, 0))}
    assert cache_key(describe(more, 1)) != key
    assert portable_key("micro-more") != portable_key("micro")
    monkeypatch.setitem(VARIANTS, "micro", replace(MICRO, train=replace(MICRO.train, steps=5)))
    assert cache_key(describe(more, 0)) != key, "another model to continue is another build"
    assert data_seed(more, 7) == 8 and data_seed(MICRO, 7) == 7


@pytest.mark.parametrize("change", [{"vocab_size": 300}, {"seed_tasks": 5},
                                    {"corpus": replace(MICRO.corpus, programs=41)}])
def test_a_continuation_with_other_data_or_shape_is_refused_by_name(micro_variants, change):
    odd = replace(MICRO, continues="micro", **change)
    with pytest.raises(ValueError, match=f"these differ: {next(iter(change))}"):
        describe(odd, 0)
    with pytest.raises(ValueError, match="unknown tiny-coder variant 'nowhere'"):
        describe(replace(MICRO, continues="nowhere"), 0)


def test_load_start_refuses_a_model_of_another_tokenizer(tmp_path, micro_variants):
    from transformers import AutoTokenizer

    parent = build_here("micro", cache_dir=tmp_path, threads=1)
    other = AutoTokenizer.from_pretrained(ensure_model("test"))  # the shipped test model: another corpus and tokenizer
    with pytest.raises(ValueError, match="not the one this build trains with"):
        load_start(new_model(MICRO.model, other), other, parent)


def test_stronger_large_plus_continues_stronger_large_for_its_steps():
    """``stronger-large-plus``: the same settings as ``stronger-large`` (so the same corpus, examples and tokenizer), continued."""
    plus = VARIANTS["stronger-large-plus"]
    assert plus.continues == "stronger-large"
    assert continued_settings(plus) == variant_settings("stronger-large")
    assert asdict(replace(plus, continues=None)) == asdict(VARIANTS["stronger-large"])
    assert cache_key(describe(plus, 0)) != cache_key(describe(VARIANTS["stronger-large"], 0))
