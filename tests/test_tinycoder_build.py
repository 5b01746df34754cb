"""The build's time estimate and its child process: a measured s/step, one announcement, clear failures."""

from __future__ import annotations

import json

import pytest

from tinycoder import ensure_model
from tinycoder.build import build_model
from tinycoder.cache import MANIFEST, cache_key
from tinycoder.corpus import CorpusSettings
from tinycoder.model import stand_in_model
from tinycoder.settings import VARIANTS, BuildSettings, ModelShape, TrainSettings, describe, native_bf16
from tinycoder.train import measure_step_seconds

MICRO = BuildSettings(
    corpus=CorpusSettings(programs=40, inputs_per_program=5, min_inputs=4),
    vocab_size=400,
    model=ModelShape(hidden=64, layers=1, kv_heads=1, intermediate=128),
    train=TrainSettings(steps=4, batch_tokens=1024, lr=3e-3, warmup=1),
    seed_tasks=4,
)


def test_measure_step_seconds_times_real_steps_and_rejects_bad_lengths():
    model = stand_in_model(MICRO.model, MICRO.vocab_size)
    before = [p.detach().clone() for p in model.parameters()]
    seconds = measure_step_seconds(model, MICRO.train, 120, 40, steps=2)
    assert 0 < seconds < 60
    assert any((p != b).any() for p, b in zip(model.parameters(), before))  # it really stepped the optimizer
    with pytest.raises(ValueError, match="completion_len"):
        measure_step_seconds(model, MICRO.train, 40, 40)
    with pytest.raises(ValueError, match="max_len"):
        measure_step_seconds(model, MICRO.train, MICRO.train.max_len + 1, 40)


def test_build_announces_once_with_an_estimate_from_measured_steps(tmp_path, capfd):
    manifest = build_model(MICRO, 0, tmp_path / "m", progress=True, announce="building the tiny 'micro' model")
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "building the tiny 'micro' model" in line]
    assert len(lines) == 1, err
    assert "s/step measured just now" in lines[0] and f"{MICRO.train.steps} training steps" in lines[0]
    assert manifest["estimated_build_s"] > 0 and manifest["s_per_step"] > 0
    assert manifest["s_per_step"] == pytest.approx(manifest["timings"]["train_s"] / MICRO.train.steps, abs=0.05)  # train_s is rounded to 0.1 s
    assert json.loads((tmp_path / "m" / MANIFEST).read_text())["s_per_step"] == manifest["s_per_step"]


def test_build_without_progress_prints_no_announcement(tmp_path, capfd):
    manifest = build_model(MICRO, 0, tmp_path / "m", progress=False, announce="building the tiny 'micro' model")
    assert "building the tiny" not in capfd.readouterr().err
    assert manifest["estimated_build_s"] is None


def test_a_failed_child_build_is_a_clear_error(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(RuntimeError, match=r"(?s)building the tiny-coder 'test' model failed \(exit 1\).*(NotADirectory|FileExists)"):
        ensure_model("test", cache_dir=not_a_dir, progress=False)


def test_default_variant_key_changed_with_its_training_settings():
    """A default model built with batches of 6144 tokens (the settings before docs/tinycoder.md's time study) is never reused for today's settings."""
    from dataclasses import replace

    default = VARIANTS["default"]
    before = replace(default, train=replace(default.train, batch_tokens=6144))
    assert default.train.batch_tokens != 6144
    assert cache_key(describe(default, 0)) != cache_key(describe(before, 0))



def test_native_bf16_reads_the_cpu_flags(tmp_path):
    with_bf16 = tmp_path / "bf16"
    with_bf16.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512bw\n")
    without = tmp_path / "plain"
    without.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert native_bf16(str(with_bf16)) and not native_bf16(str(without))
    assert not native_bf16(str(tmp_path / "missing"))  # no /proc (macOS): float32


def test_auto_precision_resolves_before_the_key_and_float32_keeps_its_old_key(monkeypatch):
    """The cache key names what is built (bf16 or float32, never "auto"); a float32 build's key is the one it had
    before precision existed, so caches built then are reused."""
    from dataclasses import asdict, replace

    import tinycoder.settings as settings_module
    from tinycoder.settings import prompt_fingerprint, variant_settings

    with pytest.raises(ValueError, match="precision"):
        TrainSettings(precision="fp16")
    keys = {}
    for native in (True, False):
        monkeypatch.setattr(settings_module, "native_bf16", lambda native=native: native)
        settings = variant_settings("default")
        assert settings.train.precision == ("bf16" if native else "fp32")
        keys[native] = cache_key(describe(settings, 0))
    assert keys[True] != keys[False]
    fp32 = variant_settings("default")
    legacy = asdict(fp32)
    del legacy["train"]["precision"], legacy["continues"]  # continues (added later) is left out when None
    del legacy["mix"]["student_trace"], legacy["mix"]["trace_chars"], legacy["mix"]["live_only"]  # so are these, at their defaults
    assert keys[False] == cache_key({"generator": describe(fp32, 0)["generator"], "settings": legacy, "seed": 0,
                                     "prompts": prompt_fingerprint()})
    assert variant_settings("test").train.precision == "fp32"  # the test suite's model stays float32 everywhere
    assert replace(fp32, train=replace(fp32.train, precision="bf16")).train.precision == "bf16"


def test_a_bf16_build_trains_float32_weights_deterministically(tmp_path):
    from dataclasses import replace

    import torch
    from transformers import AutoModelForCausalLM

    settings = replace(MICRO, train=replace(MICRO.train, precision="bf16"))
    first = build_model(settings, 0, tmp_path / "a", progress=False)
    build_model(settings, 0, tmp_path / "b", progress=False)
    assert first["settings"]["train"]["precision"] == "bf16"
    assert first["final_loss"] < first["first_loss"]
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    assert all(p.dtype == torch.float32 for p in a.parameters())  # autocast: the master weights stay float32
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    fp32 = build_model(MICRO, 0, tmp_path / "c", progress=False)
    assert fp32["final_loss"] != first["final_loss"]  # the forward really ran in bf16


def test_prompt_loss_weight_weights_prompt_tokens_and_zero_keeps_the_old_loss_and_key():
    """``w_t``: 1 before a completion token, ``prompt_loss_weight`` before a prompt token, 0 before padding; the
    loss is ``sum_t w_t CE_t / sum_t w_t``. Weight 0 is the completion-only mean and leaves the cache key as it was."""
    from dataclasses import asdict, replace

    import torch
    import torch.nn.functional as F

    from tinycoder.settings import prompt_fingerprint
    from tinycoder.train import Encoded, collate, completion_loss

    with pytest.raises(ValueError, match="prompt_loss_weight"):
        TrainSettings(prompt_loss_weight=1.5)
    data = [Encoded([5, 6, 7, 8, 9, 10], 3), Encoded([11, 12, 13, 14], 2)]
    ids, attn, w = collate(data, [0, 1], pad_id=0, prompt_loss_weight=0.25)
    assert w.tolist() == [[0.25, 0.25, 1, 1, 1], [0.25, 1, 1, 0, 0]]
    assert collate(data, [0, 1], pad_id=0)[2].tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]]

    torch.manual_seed(0)
    model = stand_in_model(MICRO.model, MICRO.vocab_size).eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none").view(w.shape)
        expected = (ce * w).sum() / w.sum()
        completion_only = ce[w == 1].mean()
        assert completion_loss(model, ids, attn, w).item() == pytest.approx(expected.item(), rel=1e-5)
        assert completion_loss(model, *collate(data, [0, 1], pad_id=0)).item() == pytest.approx(completion_only.item(), rel=1e-5)
        assert abs(expected.item() - completion_only.item()) > 1e-3  # the prompt really counts

    weighted = replace(MICRO, train=replace(MICRO.train, prompt_loss_weight=0.25))
    assert cache_key(describe(weighted, 0)) != cache_key(describe(MICRO, 0))
    legacy = asdict(MICRO)
    del legacy["train"]["precision"], legacy["continues"]
    del legacy["train"]["prompt_loss_weight"]
    del legacy["mix"]["student_trace"], legacy["mix"]["trace_chars"], legacy["mix"]["live_only"]
    assert cache_key(describe(MICRO, 0)) == cache_key(
        {"generator": describe(MICRO, 0)["generator"], "settings": legacy, "seed": 0, "prompts": prompt_fingerprint()})


def test_stronger_large_is_stronger_on_ten_times_the_corpus_for_8000_steps():
    """The ``stronger-large`` variant: only the corpus size and the training steps differ from ``stronger`` (the shape, the
    always-right examples and every other setting are the same), and its key is its own."""
    from dataclasses import asdict

    stronger, large = asdict(VARIANTS["stronger"]), asdict(VARIANTS["stronger-large"])
    assert large["corpus"]["programs"] == 10 * stronger["corpus"]["programs"] == 40_000
    assert large["train"]["steps"] == 8000 and large["mix"]["p_correct"] == 1.0
    large["corpus"]["programs"], large["train"]["steps"] = stronger["corpus"]["programs"], stronger["train"]["steps"]
    assert large == stronger
    assert cache_key(describe(VARIANTS["stronger-large"], 0)) != cache_key(describe(VARIANTS["stronger"], 0))


def test_stronger_long_is_stronger_large_for_twice_the_steps():
    """The ``stronger-long`` variant: only the training steps differ from ``stronger-large``, and its key is its own."""
    from dataclasses import asdict

    large, long = asdict(VARIANTS["stronger-large"]), asdict(VARIANTS["stronger-long"])
    assert long["train"]["steps"] == 2 * large["train"]["steps"] == 16_000
    long["train"]["steps"] = large["train"]["steps"]
    assert long == large
    assert cache_key(describe(VARIANTS["stronger-long"], 0)) != cache_key(describe(VARIANTS["stronger-large"], 0))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_is_selectable_by_the_config_and_both_command_lines(variant):
    """``model.tiny_variant``, ``python -m tinycoder --variant`` and ``python -m bench.tiny_coder --variant`` take every
    name of ``VARIANTS`` (``--help`` after a valid ``--variant`` exits 0; an invalid choice would exit 2 first)."""
    from bench.tiny_coder import main as bench_main
    from configs.schema import ModelConfig
    from tinycoder.__main__ import main as tinycoder_main

    assert ModelConfig(tiny_variant=variant).tiny_variant == variant
    for main in (tinycoder_main, bench_main):
        with pytest.raises(SystemExit) as exited:
            main(["--variant", variant, "--help"])
        assert exited.value.code == 0
    with pytest.raises(SystemExit) as exited:
        tinycoder_main(["--variant", "no-such-variant", "--help"])
    assert exited.value.code == 2
