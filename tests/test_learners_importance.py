"""The importance-corrected objective (rl.importance_correction: tis): truncated weights min(pi_old / mu, C),
their statistics, behaviour log-probs carried through batching, and exactly today's update when switched off
or when the behaviour policy is the current one."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample, micro_batches
from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig, policy_gradient_loss
from learners.policy_learner import PolicyLearner, UpdateConfig, forward_loss_tokens

PAD = 3
TIS = PGConfig(importance_correction="tis", is_truncation=2.0)


def loss_and_grad(logp: torch.Tensor, config: PGConfig, **kw) -> tuple[torch.Tensor, torch.Tensor, dict]:
    x = logp.detach().clone().requires_grad_(True)
    out = policy_gradient_loss(x, kw.pop("adv"), kw.pop("slots"), config, **kw)
    out.loss.backward()
    return out.loss.detach(), x.grad, out.stats


def test_tis_is_todays_loss_when_behaviour_and_current_policy_agree():
    torch.manual_seed(0)
    logp, adv, slots = -torch.rand(9) * 3, torch.randn(9), torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2])
    off = loss_and_grad(logp, PGConfig(), adv=adv, slots=slots)
    on = loss_and_grad(logp, TIS, adv=adv, slots=slots, behaviour_logprobs=logp.clone())
    assert torch.equal(off[0], on[0]) and torch.equal(off[1], on[1])
    assert all(on[2][s]["is_weight"] == 1.0 and on[2][s]["is_truncated"] == 0.0 and on[2][s]["behaviour_kl"] == 0.0
               for s in (0, 1, 2))
    # Several epochs: pi_old from the no-grad pass; mu = pi_old again gives PPO's loss exactly.
    old = logp + 0.1 * torch.randn(9)
    off = loss_and_grad(logp, PGConfig(), adv=adv, slots=slots, old_logprobs=old)
    on = loss_and_grad(logp, TIS, adv=adv, slots=slots, old_logprobs=old, behaviour_logprobs=old.clone())
    assert torch.equal(off[0], on[0]) and torch.equal(off[1], on[1])


def test_off_ignores_the_behaviour_logprobs():
    logp, adv, slots = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, -1.0]), torch.zeros(2, dtype=torch.long)
    plain = loss_and_grad(logp, PGConfig(), adv=adv, slots=slots)
    given_mu = loss_and_grad(logp, PGConfig(), adv=adv, slots=slots, behaviour_logprobs=torch.tensor([-9.0, -0.1]))
    assert torch.equal(plain[0], given_mu[0]) and torch.equal(plain[1], given_mu[1])
    assert "is_weight" not in given_mu[2][0]


def test_weights_are_truncated_at_c_and_scale_each_tokens_gradient():
    # pi_old / mu = e^1 (cut to 2), e^-1, e^0.5, 1; one epoch so pi_old = pi.
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    mu = logp - torch.tensor([1.0, -1.0, 0.5, 0.0])
    adv = torch.tensor([1.0, 1.0, -2.0, 0.5])
    loss, grad, stats = loss_and_grad(logp, TIS, adv=adv, slots=torch.zeros(4, dtype=torch.long), behaviour_logprobs=mu)
    w = torch.tensor([2.0, math.exp(-1), math.exp(0.5), 1.0])
    torch.testing.assert_close(grad, -w * adv / 4)  # d l_t / d log pi = -w_t A_t / N
    torch.testing.assert_close(loss, (-w * adv).sum() / 4)
    assert stats[0]["is_weight"] == pytest.approx(float(w.mean()))
    assert stats[0]["is_truncated"] == 0.25
    r = torch.tensor([math.e, math.exp(-1), math.exp(0.5), 1.0], dtype=torch.float64)
    assert stats[0]["behaviour_kl"] == pytest.approx(float((r - 1 - r.log()).mean()))


@settings(max_examples=50, deadline=None)
@given(
    gaps=st.lists(st.floats(-30, 30), min_size=1, max_size=20),
    c=st.floats(1.0, 10.0),
)
def test_weights_stay_in_zero_to_c_whatever_the_gap(gaps, c):
    logp = torch.full((len(gaps),), -1.0)
    mu = logp - torch.tensor(gaps)
    _, grad, stats = loss_and_grad(logp, PGConfig(importance_correction="tis", is_truncation=c),
                                   adv=-torch.ones(len(gaps)), slots=torch.zeros(len(gaps), dtype=torch.long),
                                   behaviour_logprobs=mu)
    weights = grad * len(gaps)  # -w A / N with A = -1
    assert bool(torch.isfinite(grad).all()) and bool((weights >= 0).all()) and bool((weights <= c * (1 + 1e-6)).all())
    assert 0 <= stats[0]["is_weight"] <= c * (1 + 1e-6) and math.isfinite(stats[0]["behaviour_kl"])


def test_bad_input_is_refused():
    logp, adv, slots = torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        policy_gradient_loss(logp, adv, slots, TIS)
    with pytest.raises(ValueError, match="behaviour_logprobs has shape"):
        policy_gradient_loss(logp, adv, slots, TIS, behaviour_logprobs=torch.zeros(2))
    with pytest.raises(ValueError, match="importance_correction"):
        PGConfig(importance_correction="ppo")
    with pytest.raises(ValueError, match="is_truncation"):
        PGConfig(importance_correction="tis", is_truncation=0.5)
    with pytest.raises(ValueError, match="align"):
        Sample(0, [1, 2], [5, 6, 7], 1.0, behaviour_logprobs=[-0.1, -0.2])
    with pytest.raises(ValueError, match="every sample or none"):
        micro_batches([Sample(0, [1], [5], 1.0, behaviour_logprobs=[-0.1]), Sample(0, [1], [6], 1.0)], PAD, 64)


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_behaviour_logprobs_line_up_with_the_loss_tokens(mode):
    """Whatever the batching, the behaviour log-prob at a loss position is that of the token it predicts."""
    g = torch.Generator().manual_seed(1)
    samples = []
    for i in range(7):
        p, c = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        completion = torch.randint(4, 100, (c,), generator=g).tolist()
        # encode (sample, position) in the log-prob so any misplacement shows
        samples.append(Sample(i % 3, [7] * p, completion, 0.0, behaviour_logprobs=[-(i + j / 100) for j in range(c)]))
    seen = 0
    for batch in micro_batches(samples, PAD, 24, mode):
        for s_id in batch.samples:
            where = batch.loss_mask & (batch.token_sample == s_id)
            assert batch.behaviour[where].tolist() == pytest.approx(samples[s_id].behaviour_logprobs)
            assert batch.targets[where].tolist() == samples[s_id].completion_ids
            seen += 1
    assert seen == len(samples)


def make_learner(path, config: PGConfig, epochs: int = 1) -> PolicyLearner:
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = MultiLoRAModel(base, LoRASpec(rank=4, alpha=8, num_slots=2), init_b_std=0.05, seed=0)
    return PolicyLearner(model, AdapterOptimizers(model, lr=1e-2), config,
                         UpdateConfig(epochs=epochs, micro_batch_tokens=64, temperature=0.7), PAD)


def samples_for(path, behaviour: str | None) -> list[Sample]:
    """Rollout-like samples; behaviour None (no log-probs), "current" (the learner's own log pi_T), "stale"."""
    vocab = AutoModelForCausalLM.from_pretrained(path).config.vocab_size
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(8):
        ids = torch.randint(4, vocab, (11,), generator=g).tolist()
        out.append(Sample(i % 2, ids[:4], ids[4:], float(i % 3) - 1.0, group=("solve", "code_o")))
    if behaviour is None:
        return out
    learner = make_learner(path, PGConfig())
    with torch.no_grad():
        lp = {}
        for batch in micro_batches(out, PAD, 64, "pad"):
            tokens = forward_loss_tokens(learner.model, batch, temperature=0.7)
            for s in torch.unique(tokens.sample).tolist():
                lp[s] = tokens.logprobs[tokens.sample == s]
    shift = 0.0 if behaviour == "current" else 1.0
    return [Sample(s.slot, s.prompt_ids, s.completion_ids, s.reward, s.group,
                   behaviour_logprobs=(lp[i] + shift * torch.linspace(-1, 1, len(lp[i]))).tolist())
            for i, s in enumerate(out)]


def adapters_after(path, config: PGConfig, samples: list[Sample], epochs: int = 1) -> tuple[list[torch.Tensor], dict]:
    learner = make_learner(path, config, epochs)
    stats = learner.step(samples)
    return [p.detach().clone() for slot in (0, 1) for p in learner.model.slot_parameters(slot)], stats


@pytest.mark.parametrize("epochs", [1, 2])
def test_a_learner_step_is_unchanged_when_off_or_when_behaviour_is_current(tiny_qwen2, epochs):
    plain, plain_stats = adapters_after(tiny_qwen2, PGConfig(), samples_for(tiny_qwen2, None), epochs)
    off, _ = adapters_after(tiny_qwen2, PGConfig(), samples_for(tiny_qwen2, "stale"), epochs)
    assert all(torch.equal(a, b) for a, b in zip(plain, off)), "correction off must ignore the behaviour log-probs"
    current, stats = adapters_after(tiny_qwen2, TIS, samples_for(tiny_qwen2, "current"), epochs)
    worst = max(float((a - b).abs().max()) for a, b in zip(plain, current))
    assert worst <= 1e-6, f"tis with mu = pi_old moved the adapters {worst:.2e} away from today's update"
    assert all(abs(stats[s]["is_weight"] - 1) < 1e-5 and stats[s]["is_truncated"] == 0.0 for s in (0, 1))
    stale, stale_stats = adapters_after(tiny_qwen2, TIS, samples_for(tiny_qwen2, "stale"), epochs)
    assert max(float((a - b).abs().max()) for a, b in zip(plain, stale)) > 1e-4
    assert all(0 < stale_stats[s]["is_truncated"] < 1 and stale_stats[s]["behaviour_kl"] > 0.01 for s in (0, 1))
    assert set(plain_stats[0]) < set(stale_stats[0])
