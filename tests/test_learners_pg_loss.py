"""The policy-gradient loss and task-relative advantages, on hand-checkable numbers."""

from __future__ import annotations

import math

import pytest
import torch

from learners.pg_loss import PGConfig, group_normalised_advantages, policy_gradient_loss, token_entropy, token_logprobs


def test_advantages_are_token_weighted_whitening_per_group():
    # Group "a": rewards 1, 0 over 1 and 3 tokens -> token mean 0.25, token variance 0.1875.
    adv = group_normalised_advantages([1.0, 0.0, 5.0, 5.0, 2.0], ["a", "a", "b", "b", "c"], [1, 3, 2, 4, 7], eps=0.0)
    std = math.sqrt(0.1875)
    torch.testing.assert_close(adv[:2], torch.tensor([0.75 / std, -0.25 / std]))
    # Equal rewards and singleton groups carry no signal.
    assert torch.equal(adv[2:], torch.zeros(3))


@pytest.mark.parametrize("winner_tokens, loser_tokens, centred, whitened", [
    (40, 80, (0.50, -0.25), (1.4142, -0.7071)),   # the shorter completion wins: it carries the larger advantage
    (80, 40, (0.25, -0.50), (0.7071, -1.4142)),   # the longer wins: the shorter loser still carries the larger one
])
def test_token_weighting_favours_the_shorter_completion_of_a_pair(winner_tokens, loser_tokens, centred, whitened):
    """A group of two, rewards 0.75 (winner) and 0: token-weighted, per token the shorter completion carries the
    larger advantage whichever way the reward points; summed over each completion the two are equal and opposite."""
    rewards, groups, tokens = [0.75, 0.0], ["g", "g"], [winner_tokens, loser_tokens]
    c = group_normalised_advantages(rewards, groups, tokens, eps=0.0, whiten=False)
    w = group_normalised_advantages(rewards, groups, tokens, eps=0.0)
    torch.testing.assert_close(c, torch.tensor(centred), atol=1e-4, rtol=0)
    torch.testing.assert_close(w, torch.tensor(whitened), atol=1e-4, rtol=0)
    assert float(c[0] * tokens[0] + c[1] * tokens[1]) == pytest.approx(0.0, abs=1e-5)


def test_sequence_weighting_is_grpos_group_mean_whatever_the_lengths():
    for tokens in ([40, 80], [80, 40], [5, 5]):
        c = group_normalised_advantages([0.75, 0.0], ["g", "g"], tokens, eps=0.0, whiten=False, weighting="sequence")
        w = group_normalised_advantages([0.75, 0.0], ["g", "g"], tokens, eps=0.0, weighting="sequence")
        torch.testing.assert_close(c, torch.tensor([0.375, -0.375]))
        torch.testing.assert_close(w, torch.tensor([1.0, -1.0]))  # a group of two whitens to +-1 at any lengths
    with pytest.raises(ValueError, match="advantage weighting"):
        group_normalised_advantages([1.0, 0.0], ["g", "g"], [1, 1], weighting="words")


def test_advantages_reject_bad_input():
    with pytest.raises(ValueError, match="same length"):
        group_normalised_advantages([1.0, 2.0], ["a"], [1, 1])
    with pytest.raises(ValueError, match="finite"):
        group_normalised_advantages([float("nan")], ["a"], [1])
    with pytest.raises(ValueError, match="token_counts > 0"):
        group_normalised_advantages([1.0], ["a"], [0])


def test_on_policy_gradient_is_reinforce_with_per_adapter_token_mean():
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.5], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -2.0, 0.5, 0.5])
    slots = torch.tensor([0, 0, 0, 4, 4])
    out = policy_gradient_loss(logp, adv, slots, PGConfig())
    out.loss.backward()
    # d loss / d logp_t = -A_t / N_slot(t)
    torch.testing.assert_close(logp.grad, torch.tensor([-1 / 3, -1 / 3, 2 / 3, -0.25, -0.25]))
    assert set(out.stats) == {0, 4}
    assert out.stats[0]["tokens"] == 3 and out.stats[0]["clip_fraction"] == 0.0 and out.stats[0]["ratio"] == 1.0


def test_an_adapters_gradient_does_not_depend_on_its_batch_mates():
    torch.manual_seed(0)
    logp = torch.randn(6, requires_grad=True)
    adv, slots = torch.randn(6), torch.tensor([1, 1, 1, 2, 2, 2])
    policy_gradient_loss(logp, adv, slots, PGConfig()).loss.backward()
    mixed = logp.grad[:3].clone()
    alone = logp.detach()[:3].clone().requires_grad_(True)
    policy_gradient_loss(alone, adv[:3], slots[:3], PGConfig()).loss.backward()
    torch.testing.assert_close(mixed, alone.grad)


def test_ppo_clipping_stops_the_gradient_outside_the_trust_region():
    old = torch.zeros(4)
    # ratios e^0.5 (above 1.2) and e^-0.5 (below 0.8), with positive and negative advantages.
    logp = torch.tensor([0.5, 0.5, -0.5, -0.5], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = policy_gradient_loss(logp, adv, torch.zeros(4, dtype=torch.long), PGConfig(clip_epsilon=0.2), old_logprobs=old)
    out.loss.backward()
    # Clipped (zero gradient): ratio too high with A > 0, too low with A < 0. Unclipped: the other two.
    assert logp.grad[0] == 0 and logp.grad[3] == 0
    torch.testing.assert_close(logp.grad[1], torch.tensor(math.exp(0.5) / 4))
    torch.testing.assert_close(logp.grad[2], torch.tensor(-math.exp(-0.5) / 4))
    assert out.stats[0]["clip_fraction"] == 0.5


def test_kl_to_reference_is_zero_at_the_reference_and_positive_elsewhere():
    ref = torch.tensor([-1.0, -2.0, -0.3])
    slots = torch.zeros(3, dtype=torch.long)
    same = policy_gradient_loss(ref.clone(), torch.zeros(3), slots, PGConfig(kl_coef=0.1), ref_logprobs=ref)
    assert same.stats[0]["kl"] == 0.0 and same.loss.item() == 0.0
    moved = policy_gradient_loss(ref + torch.tensor([0.3, -0.2, 0.1]), torch.zeros(3), slots, PGConfig(kl_coef=0.1), ref_logprobs=ref)
    assert moved.stats[0]["kl"] > 0 and moved.loss.item() > 0


def test_entropy_bonus_lowers_the_loss_and_logprob_helpers_match_torch():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([0, 3, 10, 7, 7])
    torch.testing.assert_close(token_logprobs(logits, targets), torch.log_softmax(logits, -1)[torch.arange(5), targets])
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(token_entropy(logits), dist.entropy())
    ent = token_entropy(logits)
    out = policy_gradient_loss(token_logprobs(logits, targets), torch.zeros(5), torch.zeros(5, dtype=torch.long),
                               PGConfig(entropy_coef=0.01), entropy=ent)
    torch.testing.assert_close(out.loss, -0.01 * ent.mean())


def test_loss_rejects_inconsistent_inputs():
    x = torch.zeros(3)
    s = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="must all be"):
        policy_gradient_loss(x, torch.zeros(2), s, PGConfig())
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_gradient_loss(x, x, s, PGConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy"):
        policy_gradient_loss(x, x, s, PGConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="clip_epsilon"):
        PGConfig(clip_epsilon=1.5)


def test_step_targets_take_the_weighting_and_dr_grpos_constant_normaliser():
    from learners.batching import Sample
    from learners.data_parallel import step_targets
    from learners.policy_learner import UpdateConfig

    samples = [Sample(0, [1], [2] * 40, 0.75, "g"), Sample(0, [1], [3] * 80, 0.0, "g"), Sample(1, [1], [4] * 10, 1.0, "g")]
    token = step_targets(samples, whiten=False)
    torch.testing.assert_close(token.advantages, torch.tensor([0.5, -0.25, 0.0]))
    assert token.slot_token_totals == {0: 120.0, 1: 10.0}  # N_a: the adapter's completion tokens
    dr_grpo = UpdateConfig(advantage_norm="center", advantage_weighting="sequence", constant_normaliser=192).targets(samples)
    torch.testing.assert_close(dr_grpo.advantages, torch.tensor([0.375, -0.375, 0.0]))
    assert dr_grpo.slot_token_totals == {0: 2 * 192.0, 1: 192.0}  # N_a = S_a L_max
    with pytest.raises(ValueError, match="advantage_weighting"):
        UpdateConfig(advantage_weighting="words")
    with pytest.raises(ValueError, match="constant_normaliser"):
        step_targets(samples, constant_normaliser=-1)
