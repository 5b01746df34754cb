"""The learners' memory-bounded paths equal the plain ones, on a real tiny Qwen2 with a mixed-adapter batch.

- Chunked LM head / log-softmax / entropy (``logit_chunk_tokens``) and per-decoder-layer activation
  checkpointing give the plain path's log-probs, entropies, losses and adapter gradients, for the policy
  pass (with grad), the old-policy pass (epochs > 1) and the KL reference pass (no grad), and a whole
  ``PolicyLearner.step`` lands on the same adapter weights (atol lr / 100 after AdamW). Float32 tolerances: atol 1e-6 / rtol 1e-5 on
  log-probs, entropies and losses, atol 1e-7 / rtol 1e-4 on gradients (summation order of the chunked
  matmuls is the only difference; in practice most values are bit-identical).
- Neither keeps what it bounds: with chunking no vocabulary-wide tensor is saved for backward; with
  checkpointing no decoder-layer activation is.
- A bfloat16 base trains float32 master factors (float32 gradients) whose gradients are close to a float32
  reference of the same weights (relative L2 error per slot <= 5e-2, bf16 has 8 mantissa bits), and the
  LoRA branch saves no float32 copy of its input.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample, TokenBatch, micro_batches
from learners.multi_lora import NO_ADAPTER, LoRASpec, MultiLoRALinear, MultiLoRAModel
from learners.pg_loss import PGConfig, policy_gradient_loss
from learners.policy_learner import PolicyLearner, UpdateConfig, forward_loss_tokens, resolve_activation_checkpointing

PAD = 3
SLOTS = 3
LOGP_TOL = dict(atol=1e-6, rtol=1e-5)
GRAD_TOL = dict(atol=1e-7, rtol=1e-4)
LOSS = PGConfig(kl_coef=0.05, entropy_coef=0.01)


def make_model(path, dtype=torch.float32) -> MultiLoRAModel:
    base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return MultiLoRAModel(base, LoRASpec(rank=4, alpha=8, num_slots=SLOTS), init_b_std=0.05, seed=0)


def mixed_samples(vocab: int, n: int = 9, seed: int = 0) -> list[Sample]:
    """Samples of slots 0, 1, 2 with prompts of 3-9 and completions of 4-14 tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, c = int(torch.randint(3, 10, (1,), generator=g)), int(torch.randint(4, 15, (1,), generator=g))
        ids = torch.randint(4, vocab, (p + c,), generator=g).tolist()
        out.append(Sample(slot=i % SLOTS, prompt_ids=ids[:p], completion_ids=ids[p:], reward=float(i % 3) - 1.0))
    return out


def one_batch(samples: list[Sample], mode: str = "pad") -> TokenBatch:
    (batch,) = micro_batches(samples, PAD, 10_000, mode)
    return batch


def policy_pass(model: MultiLoRAModel, batch: TokenBatch, chunk: int, ref: torch.Tensor | None = None, loss: PGConfig = LOSS):
    """Log-probs, entropy, loss and every slot's gradients of one policy pass (``loss``: KL to ``ref`` and entropy bonus)."""
    for p in model.parameters():
        p.grad = None
    tokens = forward_loss_tokens(model, batch, entropy=True, temperature=0.7, logit_chunk_tokens=chunk)
    n = tokens.logprobs.shape[0]
    advantages = torch.linspace(-1.0, 1.0, n)
    if batch.adapter_index.dim() == 1:  # per-row index (padded): each loss token's row gives its slot
        slots = batch.adapter_index[batch.loss_mask.nonzero()[:, 0]]
    else:  # per-token index (packed)
        slots = batch.adapter_index[batch.loss_mask]
    out = policy_gradient_loss(tokens.logprobs, advantages, slots, loss, ref_logprobs=ref, entropy=tokens.entropy)
    out.loss.backward()
    grads = [[p.grad.clone() if p.grad is not None else None for p in model.slot_parameters(s)] for s in range(SLOTS)]
    return tokens.logprobs.detach(), tokens.entropy.detach(), out.loss.detach(), grads


def assert_grads_close(got, expected):
    for slot_got, slot_exp in zip(got, expected):
        for g, e in zip(slot_got, slot_exp):
            assert (g is None) == (e is None)
            if e is not None:
                torch.testing.assert_close(g, e, **GRAD_TOL)


@pytest.mark.parametrize("mode", ["pad", "pack"])
@pytest.mark.parametrize("checkpointing,chunk", [(False, 7), (True, 0), (True, 7), (True, 1)])
def test_chunked_and_checkpointed_pass_equals_plain(tiny_qwen2, mode, checkpointing, chunk):
    model = make_model(tiny_qwen2)
    batch = one_batch(mixed_samples(model.config.vocab_size), mode)
    with torch.no_grad():
        ref_plain = forward_loss_tokens(model, batch, adapter_off=True, temperature=0.7).logprobs
    plain = policy_pass(model, batch, 0, ref_plain)
    assert plain[0].shape[0] > 7 * 3, "the batch must span several chunks for this test to mean anything"
    assert all(g is not None for slot in plain[3] for g in slot), "every slot of the mixed batch must get a gradient"

    model.set_activation_checkpointing(checkpointing)
    with torch.no_grad():  # the reference (adapter off) and old-policy passes, chunked
        ref = forward_loss_tokens(model, batch, adapter_off=True, temperature=0.7, logit_chunk_tokens=chunk).logprobs
        old = forward_loss_tokens(model, batch, temperature=0.7, logit_chunk_tokens=chunk).logprobs
    torch.testing.assert_close(ref, ref_plain, **LOGP_TOL)
    torch.testing.assert_close(old, plain[0], **LOGP_TOL)
    got = policy_pass(model, batch, chunk, ref)
    for g, e in zip(got[:3], plain[:3]):
        torch.testing.assert_close(g, e, **LOGP_TOL)
    assert_grads_close(got[3], plain[3])


def test_checkpoint_recompute_replays_the_forward_routing(tiny_qwen2):
    """Backward after the index was changed (e.g. by a no-grad reference pass) still uses the forward's routing."""
    model = make_model(tiny_qwen2)
    batch = one_batch(mixed_samples(model.config.vocab_size))
    tokens = forward_loss_tokens(model, batch)
    tokens.logprobs.sum().backward()
    expected = [p.grad.clone() for s in range(SLOTS) for p in model.slot_parameters(s)]
    model.zero_grad(set_to_none=True)

    model.set_activation_checkpointing(True)
    tokens = forward_loss_tokens(model, batch)
    with torch.no_grad():
        forward_loss_tokens(model, batch, adapter_off=True)  # leaves every row routed to NO_ADAPTER
    assert bool((model.router.index == NO_ADAPTER).all())
    tokens.logprobs.sum().backward()
    got = [p.grad for s in range(SLOTS) for p in model.slot_parameters(s)]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, **GRAD_TOL)
    assert bool((model.router.index == NO_ADAPTER).all()), "the recompute must restore the routing it found"
    model.set_activation_checkpointing(False)
    assert all("forward" not in vars(layer) for layer in model.decoder_layers())


@pytest.mark.parametrize("checkpointing,chunk", [(True, 5), (False, 5), (True, 0)])
def test_learner_step_with_old_policy_and_reference_equals_plain(tiny_qwen2, checkpointing, chunk):
    """epochs=2 (old-policy pass), KL to the base (reference pass), entropy bonus: same weights and stats after a step."""
    results = []
    for ckpt, c in ((False, 0), (checkpointing, chunk)):
        model = make_model(tiny_qwen2)
        samples = mixed_samples(model.config.vocab_size, n=12, seed=4)
        learner = PolicyLearner(model, AdapterOptimizers(model, lr=1e-3), LOSS,
                                UpdateConfig(epochs=2, micro_batch_tokens=64, activation_checkpointing=ckpt, logit_chunk_tokens=c), PAD)
        assert model.activation_checkpointing is ckpt
        stats = learner.step(samples)
        results.append((stats, [p.detach().clone() for s in range(SLOTS) for p in model.slot_parameters(s)]))
    (plain_stats, plain_w), (stats, weights) = results
    assert plain_stats.keys() == stats.keys() == {0, 1, 2}
    for slot in stats:
        for key in ("loss", "pg_loss", "kl", "entropy", "ratio", "clip_fraction"):
            assert stats[slot][key] == pytest.approx(plain_stats[slot][key], rel=1e-4, abs=1e-6), (slot, key)
        assert plain_stats[slot]["kl"] > 0 and plain_stats[slot]["ratio"] != 1.0
    # AdamW divides by sqrt(v): a rounding-level difference in a near-zero gradient entry can move that weight
    # by a fraction of lr (1e-3), so weights are compared at atol = lr / 100.
    for w, e in zip(weights, plain_w):
        torch.testing.assert_close(w, e, atol=1e-5, rtol=1e-5)


def saved_for_backward(fn) -> list[torch.Tensor]:
    """Every tensor autograd saves for backward while ``fn`` runs (outside any checkpointed region)."""
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def test_bounded_paths_keep_no_vocab_wide_or_layer_tensors(tiny_qwen2):
    model = make_model(tiny_qwen2)
    batch = one_batch(mixed_samples(model.config.vocab_size))
    vocab, hidden = model.config.vocab_size, model.config.hidden_size

    def vocab_wide(ts):
        return [t for t in ts if t.dim() >= 1 and t.shape[-1] == vocab and t.numel() > vocab]

    plain = saved_for_backward(lambda: forward_loss_tokens(model, batch, entropy=True))
    chunked = saved_for_backward(lambda: forward_loss_tokens(model, batch, entropy=True, logit_chunk_tokens=8))
    assert vocab_wide(plain), "the plain path saves [N, V] logits (else this test checks nothing)"
    assert not vocab_wide(chunked)

    def wide(ts):  # the MLP's activations: [.., intermediate] tensors
        return [t for t in ts if t.dim() >= 2 and t.shape[-1] == model.config.intermediate_size]

    assert wide(plain)
    model.set_activation_checkpointing(True)
    both = saved_for_backward(lambda: forward_loss_tokens(model, batch, entropy=True, logit_chunk_tokens=8))
    assert not wide(both) and not vocab_wide(both)
    assert sum(t.numel() for t in both) < sum(t.numel() for t in plain) / 4
    assert all(t.shape[-1] in (hidden, 1) or t.dim() <= 1 or t.numel() <= batch.input_ids.numel() * hidden for t in both)


def test_bf16_base_trains_float32_masters_close_to_float32(tiny_qwen2):
    model16 = make_model(tiny_qwen2, dtype=torch.bfloat16)
    model32 = make_model(tiny_qwen2, dtype=torch.float32)
    with torch.no_grad():  # the float32 reference computes with exactly the bf16 base weights
        for (name, p16), (_, p32) in zip(model16.model.named_parameters(), model32.model.named_parameters()):
            if "lora_" not in name:
                p32.copy_(p16.float())
    assert all(p.dtype == torch.float32 for p in model16.slot_parameters(0))
    batch = one_batch(mixed_samples(model16.config.vocab_size))
    model16.set_activation_checkpointing(True)
    no_kl = PGConfig(entropy_coef=0.01)
    _, _, loss16, grads16 = policy_pass(model16, batch, 7, loss=no_kl)
    _, _, loss32, grads32 = policy_pass(model32, batch, 0, loss=no_kl)
    assert loss16.dtype == torch.float32
    torch.testing.assert_close(loss16, loss32, atol=2e-2, rtol=2e-2)
    for slot in range(SLOTS):
        g16 = torch.cat([g.flatten() for g in grads16[slot]])
        g32 = torch.cat([g.flatten() for g in grads32[slot]])
        assert g16.dtype == torch.float32
        rel = float((g16 - g32).norm() / g32.norm())
        assert rel < 5e-2, f"slot {slot}: bf16 gradient relative error {rel:.3g}"


def test_lora_branch_of_a_bf16_base_saves_no_float32_activation():
    torch.manual_seed(0)
    base = torch.nn.Linear(64, 96).to(torch.bfloat16)
    spec = LoRASpec(rank=4, alpha=8, num_slots=2)
    from learners.multi_lora import AdapterRouter

    router = AdapterRouter(2)
    layer = MultiLoRALinear(base, spec, router)
    with torch.no_grad():
        for b in layer.lora_B:
            b.normal_(0, 0.1)
    router.set([1, 0, 1])
    x = torch.randn(3, 10, 64, dtype=torch.bfloat16, requires_grad=True)
    out = []
    saved = saved_for_backward(lambda: out.append(layer(x)))
    assert out[0].dtype == torch.bfloat16
    big = [t for t in saved if t.numel() >= 10 * 64]
    assert big and all(t.dtype == torch.bfloat16 for t in big), [(tuple(t.shape), t.dtype) for t in big]
    out[0].float().square().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in (layer.lora_A[0], layer.lora_B[1]))


def test_resolve_activation_checkpointing():
    assert resolve_activation_checkpointing("on", "cpu") is True
    assert resolve_activation_checkpointing("off", "cuda") is False
    assert resolve_activation_checkpointing("auto", "cpu") is False
    assert resolve_activation_checkpointing("auto", torch.device("cuda", 0)) is True
    with pytest.raises(ValueError, match="activation_checkpointing"):
        resolve_activation_checkpointing("yes", "cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logit_chunk_tokens"):
        UpdateConfig(logit_chunk_tokens=-1)
