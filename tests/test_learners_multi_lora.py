"""The multi-adapter LoRA layer against PEFT and against separate single-adapter passes, on real tiny models."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from learners.multi_lora import NO_ADAPTER, LoRASpec, MultiLoRAModel
from learners.peft_io import load_adapter, save_adapter, slot_state_dict

# Float32 throughout: differences are summation-order rounding, far below these tolerances.
ATOL = 1e-5


def load(path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def multi(path, slots=3, rank=4, alpha=8.0, rslora=False, strategy="grouped", seed=0) -> MultiLoRAModel:
    spec = LoRASpec(rank=rank, alpha=alpha, num_slots=slots, rslora=rslora)
    return MultiLoRAModel(load(path), spec, strategy=strategy, init_b_std=0.05, seed=seed).eval()


def random_ids(rows: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("strategy", ["grouped", "bmm"])
def test_zero_adapters_give_exact_base_logits(tiny_qwen2, strategy):
    base = load(tiny_qwen2)
    model = MultiLoRAModel(load(tiny_qwen2), LoRASpec(rank=4, alpha=8, num_slots=2), strategy=strategy)
    ids = random_ids(3, 12, base.config.vocab_size)
    with torch.no_grad():
        expected = base(ids).logits
        with_zero_adapters = model(ids, adapter_index=[0, 1, 0]).logits
        adapter_off = model(ids, adapter_index=[NO_ADAPTER] * 3).logits
    assert torch.equal(with_zero_adapters, expected)
    assert torch.equal(adapter_off, expected)


@pytest.mark.parametrize("strategy", ["grouped", "bmm"])
@pytest.mark.parametrize("fixture", ["tiny_qwen2", "tiny_llama", "tiny_qwen2_tied"])
def test_exported_adapter_matches_peft(fixture, strategy, request, tmp_path):
    path = request.getfixturevalue(fixture)
    model = multi(path, strategy=strategy)
    ids = random_ids(4, 10, model.config.vocab_size)
    with torch.no_grad():
        ours = model(ids, adapter_index=[2, 0, NO_ADAPTER, 2]).logits
    save_adapter(model, 2, tmp_path / "slot2")
    config = json.loads((tmp_path / "slot2" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"
    peft_model = PeftModel.from_pretrained(load(path), tmp_path / "slot2").eval()
    with torch.no_grad():
        theirs = peft_model(ids).logits
        base = load(path)(ids).logits
    torch.testing.assert_close(ours[[0, 3]], theirs[[0, 3]], atol=ATOL, rtol=0)
    assert not torch.allclose(theirs[0], base[0], atol=1e-3), "the adapter must change the logits for this test to mean anything"
    torch.testing.assert_close(ours[2], base[2], atol=0, rtol=0)


def test_peft_keys_follow_the_saved_peft_layout(tiny_qwen2, tmp_path):
    from safetensors.torch import load_file

    model = multi(tiny_qwen2)
    save_adapter(model, 0, tmp_path / "a")
    keys = set(load_file(str(tmp_path / "a" / "adapter_model.safetensors")))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in keys
    assert len(keys) == 2 * 7 * model.config.num_hidden_layers


def test_rslora_export_matches_peft(tiny_qwen2, tmp_path):
    model = multi(tiny_qwen2, rank=8, alpha=4.0, rslora=True)
    ids = random_ids(2, 9, model.config.vocab_size)
    with torch.no_grad():
        ours = model(ids, adapter_index=[1, 1]).logits
    save_adapter(model, 1, tmp_path / "rs")
    peft_model = PeftModel.from_pretrained(load(tiny_qwen2), tmp_path / "rs").eval()
    with torch.no_grad():
        torch.testing.assert_close(ours, peft_model(ids).logits, atol=ATOL, rtol=0)


def test_import_roundtrip_and_alpha_conversion(tiny_qwen2, tmp_path):
    source = multi(tiny_qwen2, alpha=8.0, seed=1)
    save_adapter(source, 1, tmp_path / "src")
    target = multi(tiny_qwen2, alpha=32.0, seed=2)  # other alpha: B is rescaled on import
    load_adapter(target, 0, tmp_path / "src")
    ids = random_ids(2, 8, source.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(target(ids, adapter_index=[0, 0]).logits, source(ids, adapter_index=[1, 1]).logits, atol=ATOL, rtol=0)
    # Re-import into the same spec is bit-exact.
    again = multi(tiny_qwen2, alpha=8.0, seed=3)
    load_adapter(again, 2, tmp_path / "src")
    for key, tensor in slot_state_dict(source, 1).items():
        assert torch.equal(slot_state_dict(again, 2)[key], tensor)


def test_import_rejects_wrong_rank_and_missing_files(tiny_qwen2, tmp_path):
    save_adapter(multi(tiny_qwen2, rank=4), 0, tmp_path / "r4")
    with pytest.raises(ValueError, match="rank 4"):
        load_adapter(multi(tiny_qwen2, rank=2), 0, tmp_path / "r4")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_adapter(multi(tiny_qwen2), 0, tmp_path / "nothing-here")


@pytest.mark.parametrize("strategy", ["grouped", "bmm"])
def test_mixed_batch_gradients_equal_separate_passes(tiny_qwen2, strategy):
    """Sum of per-row losses: the mixed batch's gradient of each slot equals the gradient of that slot's rows alone."""
    model = multi(tiny_qwen2, slots=4, strategy=strategy)
    ids = random_ids(6, 11, model.config.vocab_size, seed=3)
    index = [2, 0, 2, NO_ADAPTER, 1, 0]  # slot 3 unused

    def loss_of(rows: list[int], routing: list[int]) -> torch.Tensor:
        logits = model(ids[rows], adapter_index=routing).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[rows, 1:].flatten(), reduction="sum")

    model.zero_grad(set_to_none=True)
    loss_of(list(range(6)), index).backward()
    mixed = {slot: [p.grad.clone() if p.grad is not None else None for p in model.slot_parameters(slot)] for slot in range(4)}
    assert all(g is None for g in mixed[3]), "an unused adapter must get no gradient"
    for slot in (0, 1, 2):
        rows = [i for i, s in enumerate(index) if s == slot]
        model.zero_grad(set_to_none=True)
        loss_of(rows, [slot] * len(rows)).backward()
        for got, want in zip(mixed[slot], (p.grad for p in model.slot_parameters(slot))):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            assert want.abs().max() > 0


def test_unsorted_and_sorted_batches_agree(tiny_qwen2):
    """Contiguous groups use views, scattered ones use index_select/index_add: both must give the same logits."""
    model = multi(tiny_qwen2)
    ids = random_ids(6, 7, model.config.vocab_size, seed=4)
    index = torch.tensor([1, 0, 2, 0, 1, NO_ADAPTER])
    order = torch.argsort(index, stable=True)
    with torch.no_grad():
        scattered = model(ids, adapter_index=index).logits
        contiguous = model(ids[order], adapter_index=index[order]).logits
    torch.testing.assert_close(scattered[order], contiguous, atol=ATOL, rtol=0)


def test_per_token_routing_matches_per_row(tiny_qwen2):
    model = multi(tiny_qwen2)
    ids = random_ids(3, 8, model.config.vocab_size, seed=5)
    with torch.no_grad():
        per_row = model(ids, adapter_index=[2, NO_ADAPTER, 0]).logits
        per_token = model(ids, adapter_index=torch.tensor([2, NO_ADAPTER, 0])[:, None].expand(3, 8)).logits
    torch.testing.assert_close(per_row, per_token, atol=ATOL, rtol=0)


@pytest.mark.parametrize("strategy", ["grouped", "bmm"])
def test_kv_cached_generation_keeps_each_rows_adapter(tiny_qwen2, strategy):
    """Greedy generation of a mixed batch equals generating each row alone with its adapter (PEFT as reference)."""
    model = multi(tiny_qwen2, strategy=strategy)
    prompts = random_ids(4, 6, model.config.vocab_size, seed=6)
    index = [1, NO_ADAPTER, 2, 1]
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=model.config.pad_token_id, eos_token_id=None)
    with torch.no_grad():
        mixed = model.generate(prompts, attention_mask=torch.ones_like(prompts), adapter_index=index, **kwargs)
        for row, slot in enumerate(index):
            alone = model.generate(prompts[row : row + 1], attention_mask=torch.ones_like(prompts[row : row + 1]), adapter_index=[slot], **kwargs)
            assert torch.equal(mixed[row], alone[0]), f"row {row} (slot {slot}) diverged in the mixed batch"
    assert model.router.index is None, "generate must restore the previous routing"


def test_replacing_weights_in_place_keeps_parameter_objects(tiny_qwen2):
    model = multi(tiny_qwen2)
    before = [id(p) for p in model.slot_parameters(0)]
    factors = model.slot_factors(1)
    model.set_slot_factors(0, factors)
    assert [id(p) for p in model.slot_parameters(0)] == before
    for path, (a, b) in model.slot_factors(0).items():
        assert torch.equal(a, factors[path][0]) and torch.equal(b, factors[path][1])
    bad = dict(factors)
    path = next(iter(bad))
    bad[path] = (bad[path][0][:1], bad[path][1])
    with pytest.raises(ValueError, match="shape"):
        model.set_slot_factors(0, bad)
    nan = dict(factors)
    nan[path] = (torch.full_like(factors[path][0], float("nan")), factors[path][1])
    with pytest.raises(ValueError, match="NaN"):
        model.set_slot_factors(0, nan)


def test_bad_routing_gives_clear_errors(tiny_qwen2):
    model = multi(tiny_qwen2, slots=2)
    ids = random_ids(2, 5, model.config.vocab_size)
    with pytest.raises(RuntimeError, match="no adapter index"):
        model(ids)
    with pytest.raises(ValueError, match=r"in \[0, 2\)"):
        model(ids, adapter_index=[0, 2])
    with pytest.raises(ValueError, match="rows"):
        model(ids, adapter_index=[0, 1, 1])
    with pytest.raises(TypeError, match="integers"):
        model(ids, adapter_index=[0.5, 1.0])
    with pytest.raises(ValueError, match="not in the model"):
        MultiLoRAModel(load(tiny_qwen2), LoRASpec(rank=2, alpha=2, num_slots=1, target_modules=("q_proj", "qkv_proj")))
    with pytest.raises(IndexError):
        model.slot_parameters(5)


def test_bfloat16_base_trains_float32_adapters(tiny_qwen2):
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.bfloat16)
    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.bfloat16)
    model = MultiLoRAModel(base, LoRASpec(rank=4, alpha=8, num_slots=2))
    ids = random_ids(2, 6, model.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(model(ids, adapter_index=[0, NO_ADAPTER]).logits, reference(ids).logits)
    model(ids, adapter_index=[1, 1]).logits.float().logsumexp(-1).mean().backward()
    params = model.slot_parameters(1)
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32 for p in params)
    assert any(p.grad.abs().max() > 0 for p in params)


def _factors(mlm: MultiLoRAModel) -> dict[str, torch.Tensor]:
    return {f"{path}.{slot}.{n}": t for slot in range(mlm.num_slots) for path, ab in mlm.slot_factors(slot).items()
            for n, t in zip("AB", ab)}


def test_seeded_init_draws_on_the_cpu_whatever_the_masters_dtype(tiny_qwen2):
    """A seed gives the same adapters whatever the slot's device or dtype: the draws are made on the CPU in float32
    and copied (drawing into the slot itself fails for CUDA slots and gives other numbers in another dtype)."""
    spec = LoRASpec(rank=4, alpha=8.0, num_slots=2)
    f32 = _factors(MultiLoRAModel(load(tiny_qwen2), spec, init_b_std=0.05, seed=7))
    f64 = _factors(MultiLoRAModel(load(tiny_qwen2), spec, init_b_std=0.05, seed=7, dtype=torch.float64))
    assert all(torch.equal(f32[k], f64[k].float()) for k in f32)
    again = MultiLoRAModel(load(tiny_qwen2), spec, init_b_std=0.05, seed=1, dtype=torch.float64)
    again.reset_slot(1, seed=7)  # re-initialising one slot draws exactly the stream a fresh model's slot gets
    fresh = MultiLoRAModel(load(tiny_qwen2), LoRASpec(rank=4, alpha=8.0, num_slots=1), init_b_std=0.05, seed=7)
    assert all(torch.equal(a.float(), fa) and torch.equal(b.float(), fb)
               for (a, b), (fa, fb) in zip(again.slot_factors(1).values(), fresh.slot_factors(0).values()))


def test_a_base_on_two_devices_or_on_the_wrong_one_is_a_clear_error(tiny_qwen2):
    """A module left elsewhere (here: one layer on the meta device, as a failed load leaves it) or a base that is
    not where the learner runs fails at construction, naming the module and both devices."""
    spec = LoRASpec(rank=4, alpha=8.0, num_slots=2)
    split = load(tiny_qwen2)
    split.model.layers[1].mlp.to("meta")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.\w+\.weight is on meta while .* is on cpu"):
        MultiLoRAModel(split, spec, seed=0)
    with pytest.raises(ValueError, match=r"is on cpu, but this learner runs on meta"):
        MultiLoRAModel(load(tiny_qwen2), spec, seed=0, device="meta")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_adapters_on_cuda_equal_the_cpu_ones(tiny_qwen2):
    """The learner's construction on a GPU (it failed: a CPU generator drawing into CUDA parameters), and the same
    seed giving the same adapters on CUDA as on the CPU."""
    spec = LoRASpec(rank=4, alpha=8.0, num_slots=3)
    cpu = MultiLoRAModel(load(tiny_qwen2), spec, init_b_std=0.05, seed=11)
    gpu = MultiLoRAModel(load(tiny_qwen2).cuda(), spec, init_b_std=0.05, seed=11, device="cuda")
    assert all(torch.equal(cpu_t, gpu_t) for cpu_t, gpu_t in zip(_factors(cpu).values(), _factors(gpu).values()))
    gpu.reset_slot(2, seed=5)
    cpu.reset_slot(2, seed=5)
    assert all(torch.equal(cpu_t, gpu_t) for cpu_t, gpu_t in zip(_factors(cpu).values(), _factors(gpu).values()))
