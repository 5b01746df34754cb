"""The real bootstrap of the test variant: loads like any model, learned the formats, PEFT works, deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from tinycoder import BUILD_ENV, ensure_model, model_dir
from tinycoder.shipped import shipped_model
from tinycoder.build import make_examples
from tinycoder.settings import variant_settings
from tinycoder.cache import MANIFEST
from tinycoder.corpus import CorpusSettings, build_corpus
from tinycoder.train import collate, completion_loss, encode
from verifier import parse_answer
from verifier.sandbox import Verifier


@pytest.fixture(scope="module")
def tiny_test_model() -> Path:
    """The test variant through the public entry point (the user cache: built once, then reused)."""
    return ensure_model("test", seed=0, progress=False)


def test_loads_with_auto_classes_as_qwen2(tiny_test_model):
    assert tiny_test_model in (model_dir("test", 0), shipped_model("test")[0])  # the shipped copy where it applies
    model = AutoModelForCausalLM.from_pretrained(tiny_test_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_test_model)
    assert isinstance(model, Qwen2ForCausalLM)
    names = {n for n, _ in model.named_modules()}
    for module in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert f"model.layers.0.self_attn.{module}" in names or f"model.layers.0.mlp.{module}" in names
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert model.config.pad_token_id == tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.config.max_position_embeddings >= 1024
    text = "def f(nums):\n    return [x * 2 for x in nums if x > 3]"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    manifest = json.loads((tiny_test_model / MANIFEST).read_text())
    assert manifest["final_loss"] < manifest["first_loss"]
    assert (tiny_test_model / "tasks.jsonl").is_file()


def _mean_completion_loss(model, tokenizer, examples) -> float:
    data = encode(examples, tokenizer, 1024)
    losses = []
    with torch.no_grad():
        for start in range(0, len(data), 16):
            batch = list(range(start, min(start + 16, len(data))))
            losses.append(completion_loss(model, *collate(data, batch, tokenizer.pad_token_id)).item())
    return sum(losses) / len(losses)


def test_learned_the_formats_on_unseen_programs(tiny_test_model):
    """On examples from programs it never saw (another seed), the trained model's loss is far below a
    random-init copy's, and greedy student answers are mostly well formed."""
    settings = variant_settings("test")
    with Verifier(timeout_s=2.0) as verifier:
        corpus = build_corpus(verifier, CorpusSettings(programs=40, inputs_per_program=4, min_inputs=4), seed=999)
    examples = make_examples(corpus, settings, seed=999)
    tokenizer = AutoTokenizer.from_pretrained(tiny_test_model)
    trained = AutoModelForCausalLM.from_pretrained(tiny_test_model).eval()
    torch.manual_seed(0)
    scratch = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_test_model)).eval()
    trained_loss = _mean_completion_loss(trained, tokenizer, examples)
    scratch_loss = _mean_completion_loss(scratch, tokenizer, examples)
    assert trained_loss < 0.5 * scratch_loss, (trained_loss, scratch_loss)

    students = [e for e in examples if e.role == "student" and e.family == "code_o"][:12]
    well_formed = 0
    for e in students:
        ids = tokenizer(e.prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        out = trained.generate(ids, max_new_tokens=100, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.pad_token_id)
        well_formed += parse_answer("code_o", tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)).well_formed
    assert well_formed >= len(students) // 2, well_formed


def test_peft_lora_adapter_saves_and_loads(tiny_test_model, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_test_model)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft_model = get_peft_model(base, config)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    ids = torch.tensor([[3, 50, 60, 70, 80]])
    expected = peft_model(ids).logits
    peft_model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_test_model), tmp_path / "adapter")
    assert torch.allclose(reloaded(ids).logits, expected, atol=1e-6)
    plain = AutoModelForCausalLM.from_pretrained(tiny_test_model)(ids).logits
    assert not torch.allclose(plain, expected, atol=1e-4)  # the adapter really changes the output


def test_two_builds_with_one_seed_give_identical_weights(tiny_test_model, tmp_path):
    """The whole build (corpus, tokenizer, examples, training) twice with one seed, cut to 12 training steps:
    determinism does not depend on the step count, and a full second build cost ~2-5 min of CI. The cached build
    was made by ensure_model's child process under BUILD_ENV."""
    from dataclasses import replace

    from tinycoder.build import build_model

    test = variant_settings("test")
    short = replace(test, train=replace(test.train, steps=12))
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        build_model(short, 0, out, progress=False, threads=1)
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, f"{len(differing)} tensors differ between two builds with one seed"
    for name in ("tokenizer.json", "tasks.jsonl"):
        assert (first / name).read_text() == (second / name).read_text()
        assert (first / name).read_text() == (tiny_test_model / name).read_text()  # training steps change neither
    openmp = json.loads((tiny_test_model / MANIFEST).read_text())["openmp_env"]
    assert {k: openmp[k] for k in BUILD_ENV} == BUILD_ENV
