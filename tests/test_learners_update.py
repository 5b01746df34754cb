"""Batching (pad vs pack), per-adapter optimizers, and one real policy-gradient step on a tiny Qwen2."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample, micro_batches, pack_batch, pad_batch
from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig, policy_gradient_loss
from learners.policy_learner import PolicyLearner, UpdateConfig, forward_loss_tokens

PAD = 3


def make_model(path, slots=3, init_b_std=0.0, seed=0) -> MultiLoRAModel:
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return MultiLoRAModel(base, LoRASpec(rank=4, alpha=8, num_slots=slots), init_b_std=init_b_std, seed=seed)


def random_samples(n: int, vocab: int, slots: list[int], seed: int = 0) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, c = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
        ids = torch.randint(4, vocab, (p + c,), generator=g).tolist()
        out.append(Sample(slot=slots[i % len(slots)], prompt_ids=ids[:p], completion_ids=ids[p:], reward=float(i % 3) - 1.0))
    return out


def per_sample_logprob(model: MultiLoRAModel, samples: list[Sample], mode: str, max_tokens: int = 64) -> torch.Tensor:
    """Sum of completion-token log-probs per sample, through the learner's own batching and forward."""
    total = torch.zeros(len(samples), dtype=torch.float64)
    with torch.no_grad():
        for batch in micro_batches(samples, PAD, max_tokens, mode):
            tokens = forward_loss_tokens(model, batch)
            total.index_add_(0, tokens.sample, tokens.logprobs.double())
    model.set_adapter_index(None)
    return total


def test_packing_gives_the_same_logprobs_as_padding(tiny_qwen2):
    model = make_model(tiny_qwen2, init_b_std=0.05).eval()
    samples = random_samples(10, model.config.vocab_size, slots=[0, 2, 1, 0])
    padded = per_sample_logprob(model, samples, "pad")
    packed = per_sample_logprob(model, samples, "pack")
    torch.testing.assert_close(packed, padded, atol=1e-4, rtol=0)
    # Alone, one sample at a time: the reference both must equal.
    alone = torch.cat([per_sample_logprob(model, [s], "pad") for s in samples])
    torch.testing.assert_close(padded, alone, atol=1e-4, rtol=0)
    pad_batches, pack_batches = micro_batches(samples, PAD, 64, "pad"), micro_batches(samples, PAD, 64, "pack")
    assert sum(b.real_tokens for b in pad_batches) == sum(b.real_tokens for b in pack_batches) == sum(len(s) for s in samples)
    longest = max(len(s) for s in samples)
    for b in pad_batches + pack_batches:
        assert b.padded_tokens <= max(64, longest), "a micro-batch exceeded the token budget"
    assert all(b.input_ids.shape[1] <= longest for b in pack_batches), "packed rows must not outgrow the longest sample"


def test_batches_cover_every_completion_token_once():
    samples = random_samples(7, 50, slots=[1, 0])
    for batch in [pad_batch(samples, list(range(7)), PAD), pack_batch(samples, list(range(7)), PAD, 40)]:
        counts = torch.bincount(batch.token_sample[batch.loss_mask], minlength=7)
        assert counts.tolist() == [len(s.completion_ids) for s in samples]
        # Every loss target is the sample's own completion token.
        for sid, s in enumerate(samples):
            assert batch.targets[batch.token_sample == sid].tolist() == list(s.completion_ids)
    with pytest.raises(ValueError, match="exceed the packed row length"):
        pack_batch(samples, list(range(7)), PAD, 3)
    with pytest.raises(ValueError, match="empty completion"):
        Sample(slot=0, prompt_ids=[1], completion_ids=[], reward=0.0)


def test_one_step_moves_each_adapters_logprobs_with_its_rewards(tiny_qwen2):
    """Positive reward -> log-prob up, negative -> down, for every adapter of the mixed batch; slot 2 untouched."""
    model = make_model(tiny_qwen2, slots=3)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(7)
    samples = []
    for slot in (0, 1):
        for k in range(4):
            ids = torch.randint(4, vocab, (12,), generator=g).tolist()
            samples.append(Sample(slot=slot, prompt_ids=ids[:5], completion_ids=ids[5:], reward=1.0 if k % 2 == 0 else -1.0,
                                  group=("solve", "code_o")))
    base_weights = {n: p.detach().clone() for n, p in model.model.named_parameters() if "lora_" not in n}
    untouched = [p.detach().clone() for p in model.slot_parameters(2)]
    learner = PolicyLearner(model, AdapterOptimizers(model, lr=2e-3), PGConfig(), UpdateConfig(micro_batch_tokens=40), PAD)
    before = per_sample_logprob(model, samples, "pack")
    stats = learner.step(samples)
    after = per_sample_logprob(model, samples, "pack")
    for i, s in enumerate(samples):
        if s.reward > 0:
            assert after[i] > before[i], f"sample {i} (slot {s.slot}, reward +1) log-prob did not rise"
        else:
            assert after[i] < before[i], f"sample {i} (slot {s.slot}, reward -1) log-prob did not fall"
    assert set(stats) == {0, 1}
    assert all(stats[s]["grad_norm"] > 0 and stats[s]["samples"] == 4 and stats[s]["kl"] == 0.0 for s in (0, 1))
    for p, q in zip(model.slot_parameters(2), untouched):
        assert torch.equal(p, q) and p.grad is None
    for n, p in model.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base_weights[n]), f"frozen base weight {n} changed"


def test_kl_of_zero_adapter_is_zero_and_ppo_epochs_run(tiny_qwen2):
    model = make_model(tiny_qwen2, slots=2)  # B = 0: every adapter is the base
    samples = random_samples(6, model.config.vocab_size, slots=[0, 1], seed=3)
    learner = PolicyLearner(model, AdapterOptimizers(model, lr=1e-3), PGConfig(kl_coef=0.1, entropy_coef=0.01),
                            UpdateConfig(epochs=2, micro_batch_tokens=32, batching="pad"), PAD)
    with torch.no_grad():
        for batch in micro_batches(samples, PAD, 32, "pad"):
            on = forward_loss_tokens(model, batch)
            off = forward_loss_tokens(model, batch, adapter_off=True).logprobs
            assert torch.equal(on.logprobs, off)
            kl = policy_gradient_loss(on.logprobs, torch.zeros_like(off), torch.zeros_like(on.sample), PGConfig(kl_coef=0.1),
                                      ref_logprobs=off)
            assert kl.stats[0]["kl"] == 0.0 and kl.loss.item() == 0.0
    stats = learner.step(samples)
    # Epoch 2 starts from moved weights: KL to the base is now positive, ratios differ from 1.
    assert all(stats[s]["kl"] > 0 and stats[s]["entropy"] > 0 for s in (0, 1))
    assert any(abs(stats[s]["ratio"] - 1.0) > 0 for s in (0, 1))


def test_optimizer_reset_and_per_adapter_lr_and_clipping(tiny_qwen2):
    model = make_model(tiny_qwen2, slots=2, init_b_std=0.05)
    optim = AdapterOptimizers(model, lr=1e-3, grad_clip=1e-3)
    optim.set_lr(1, 5e-4)
    samples = random_samples(4, model.config.vocab_size, slots=[0, 1])
    learner = PolicyLearner(model, optim, PGConfig(), UpdateConfig(micro_batch_tokens=64), PAD)
    stats = learner.step(samples)
    assert optim.optimizers[0].state and optim.optimizers[1].state
    # Each adapter's clipped gradient had norm <= clip: Adam's first step is lr * g / |g| elementwise anyway,
    # so check the reported pre-clip norms exceed the clip (clipping really happened per adapter).
    assert stats[0]["grad_norm"] > 1e-3 and stats[1]["grad_norm"] > 1e-3
    assert optim.optimizers[1].param_groups[0]["lr"] == 5e-4
    factors = model.slot_factors(0)
    learner.replace_adapter(1, factors)
    assert not optim.optimizers[1].state, "replacing an adapter must reset its optimizer state"
    assert optim.optimizers[0].state, "other adapters keep theirs"
    assert optim.lr(1) == 5e-4
    for (a, b), (a2, b2) in zip(model.slot_factors(1).values(), factors.values()):
        assert torch.equal(a, a2) and torch.equal(b, b2)
    with pytest.raises(ValueError, match="out of range"):
        learner.step([Sample(slot=5, prompt_ids=[4], completion_ids=[5], reward=1.0)])


def test_nonfinite_gradient_skips_only_that_adapter(tiny_qwen2):
    model = make_model(tiny_qwen2, slots=2, init_b_std=0.05)
    optim = AdapterOptimizers(model, lr=1e-2)
    before = [p.detach().clone() for p in model.slot_parameters(1)]
    for p in model.slot_parameters(0):
        p.grad = torch.ones_like(p)
    for p in model.slot_parameters(1):
        p.grad = torch.full_like(p, float("nan"))
    norms = optim.step([0, 1])
    assert norms[0] > 0 and norms[1] != norms[1]
    for p, q in zip(model.slot_parameters(1), before):
        assert torch.equal(p, q) and p.grad is None


def test_learner_trains_the_tempered_policy_it_samples_from(tiny_qwen2):
    """With UpdateConfig.temperature T the loss sees log softmax(z / T), the sampling distribution."""
    model = make_model(tiny_qwen2, slots=1)
    samples = random_samples(3, model.config.vocab_size, slots=[0], seed=5)
    with torch.no_grad():
        for batch in micro_batches(samples, PAD, 64, "pad"):
            plain = forward_loss_tokens(model, batch).logprobs
            tempered = forward_loss_tokens(model, batch, temperature=0.5).logprobs
            hidden = model.model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                            position_ids=batch.position_ids, use_cache=False).last_hidden_state
            logits = model.model.get_output_embeddings()(hidden[batch.loss_mask]).float()
            targets = batch.targets[batch.loss_mask]
            expected = torch.log_softmax(logits / 0.5, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
            torch.testing.assert_close(tempered, expected, atol=1e-5, rtol=1e-5)
            assert not torch.allclose(plain, tempered)
    with pytest.raises(ValueError, match="temperature"):
        UpdateConfig(temperature=0.0)
