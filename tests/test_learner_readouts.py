"""How far each adapter moved, read in the learner: the KL of its policy to the base on its own sampled tokens and the
norm of its parameter update, each checked against a computation that does not go through the learner."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample
from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig, token_kl
from learners.policy_learner import PolicyLearner, UpdateConfig, head_kl
from rollouts import Sample as RolloutSample
from rollouts import mark_kl_readout

PAD = 3
TEMPERATURE = 0.6


def test_token_kl_is_the_closed_form_over_the_vocabulary():
    """p = (1/2, 1/4, 1/4) against the uniform q: KL = 1/2 ln(3/2) + 2 (1/4) ln(3/4); against itself 0."""
    p = torch.log(torch.tensor([[0.5, 0.25, 0.25]])) + 7.0  # logits are defined up to a constant
    q = torch.zeros(1, 3)
    want = 0.5 * math.log(1.5) + 0.5 * math.log(0.75)
    assert token_kl(p, q).item() == pytest.approx(want, abs=1e-6)
    assert token_kl(p, p).item() == pytest.approx(0.0, abs=1e-7)


def test_head_kl_in_chunks_equals_one_pass():
    head = torch.nn.Linear(8, 50, bias=False)
    g = torch.Generator().manual_seed(0)
    hp, hq = torch.randn(37, 8, generator=g), torch.randn(37, 8, generator=g)
    with torch.no_grad():
        whole = head_kl(head, hp, hq, TEMPERATURE, chunk_tokens=0)
        chunked = head_kl(head, hp, hq, TEMPERATURE, chunk_tokens=8)  # rows in chunks of 2
        direct = token_kl(head(hp) / TEMPERATURE, head(hq) / TEMPERATURE)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(whole, direct, rtol=1e-5, atol=1e-7)


def seeded_model(path) -> MultiLoRAModel:
    """Two slots, A drawn from seed 0, B = 0: every adapter is the base until set."""
    return MultiLoRAModel(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                          LoRASpec(rank=4, alpha=8, num_slots=2), seed=0)


def known_adapter(model: MultiLoRAModel, slot: int) -> None:
    """A fixed, non-zero adapter in ``slot``: A and B of every target drawn from one seeded generator."""
    g = torch.Generator().manual_seed(11)
    model.set_slot_factors(slot, {path: (0.3 * torch.randn(layer.lora_A[slot].shape, generator=g),
                                         0.3 * torch.randn(layer.lora_B[slot].shape, generator=g))
                                  for path, layer in model.lora_layers.items()})


def merged_copy(path, model: MultiLoRAModel, slot: int):
    """A plain transformers model whose target weights are W + s B A of ``slot``: the adapter's policy computed
    without the multi-LoRA layers."""
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for name, layer in model.lora_layers.items():
            target = plain.get_submodule(name)
            target.weight += layer.scaling * layer.lora_B[slot] @ layer.lora_A[slot]
    return plain.eval()


def completion_kl(policy, base, sample: Sample) -> list[float]:
    """KL(softmax(z_policy / T) || softmax(z_base / T)) over the vocabulary at the positions predicting each
    completion token, from the full logits of the whole sequence."""
    ids = torch.tensor([list(sample.prompt_ids) + list(sample.completion_ids)])
    start = len(sample.prompt_ids) - 1
    with torch.no_grad():
        lp = torch.log_softmax(policy(ids).logits[0, start:-1].double() / TEMPERATURE, -1)
        lq = torch.log_softmax(base(ids).logits[0, start:-1].double() / TEMPERATURE, -1)
    return (lp.exp() * (lp - lq)).sum(-1).tolist()


def samples_of(vocab: int, marked: set[int]) -> list[Sample]:
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(6):
        ids = torch.randint(4, vocab, (5 + 3 + i,), generator=g).tolist()
        out.append(Sample(slot=i % 2, prompt_ids=ids[:5], completion_ids=ids[5:], reward=float(i % 3) - 1.0,
                          kl_readout=i in marked))
    return out


def test_kl_readout_is_the_kl_of_the_merged_adapter_on_the_marked_samples(tiny_qwen2):
    """Slot 1 holds a known adapter, slot 0 none (B = 0). The learner's readout, taken before its update, equals the
    KL computed from a plain model with the adapter merged into its weights, over the marked samples' completion
    tokens only; slot 0's is exactly 0. The readout does not change the update."""
    model = seeded_model(tiny_qwen2)
    known_adapter(model, 1)
    policy, base = merged_copy(tiny_qwen2, model, 1), AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    samples = samples_of(model.config.vocab_size, marked={0, 1, 3, 4})
    want = [k for i in (1, 3) for k in completion_kl(policy, base, samples[i])]  # slot 1's marked samples
    assert sum(want) / len(want) > 1e-3  # the adapter moves the policy measurably

    update = UpdateConfig(micro_batch_tokens=24, temperature=TEMPERATURE, logit_chunk_tokens=8)
    stats = PolicyLearner(model, AdapterOptimizers(model, lr=1e-3), PGConfig(), update, PAD).step(samples)
    assert stats[1]["kl_to_base_tokens"] == len(want) == len(samples[1].completion_ids) + len(samples[3].completion_ids)
    assert stats[1]["kl_to_base"] == pytest.approx(sum(want) / len(want), rel=1e-4)
    assert stats[0]["kl_to_base"] == 0.0  # B = 0: the base itself
    assert stats[0]["kl_to_base_tokens"] == len(samples[0].completion_ids) + len(samples[4].completion_ids)

    twin = seeded_model(tiny_qwen2)  # the same step with no sample marked: no readout, the same update
    known_adapter(twin, 1)
    plain = [Sample(s.slot, s.prompt_ids, s.completion_ids, s.reward) for s in samples]
    twin_stats = PolicyLearner(twin, AdapterOptimizers(twin, lr=1e-3), PGConfig(), update, PAD).step(plain)
    assert "kl_to_base" not in twin_stats[1]
    for slot in (0, 1):
        assert all(torch.equal(p, q) for p, q in zip(twin.slot_parameters(slot), model.slot_parameters(slot)))


def test_update_norm_is_the_norm_of_the_parameters_difference(tiny_qwen2):
    """||theta_after - theta_before|| per slot, against the difference of copies taken around the step; a slot
    without samples reports none and does not move."""
    model = MultiLoRAModel(AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32),
                           LoRASpec(rank=4, alpha=8, num_slots=3), init_b_std=0.05, seed=1)
    before = {slot: [p.detach().clone() for p in model.slot_parameters(slot)] for slot in range(3)}
    samples = samples_of(model.config.vocab_size, marked=set())
    stats = PolicyLearner(model, AdapterOptimizers(model, lr=1e-3, weight_decay=0.01), PGConfig(),
                          UpdateConfig(micro_batch_tokens=24), PAD).step(samples)
    for slot in (0, 1):
        diff = math.sqrt(sum(float((p.detach().double() - b.double()).square().sum())
                             for p, b in zip(model.slot_parameters(slot), before[slot])))
        assert diff > 0 and stats[slot]["update_norm"] == pytest.approx(diff, rel=1e-5)
    assert 2 not in stats and all(torch.equal(p, b) for p, b in zip(model.slot_parameters(2), before[2]))


def test_kl_readout_marks_a_few_samples_per_member_and_role_on_its_steps():
    def sample(member: str, role: str, task: int, fixed: float | None = None) -> RolloutSample:
        return RolloutSample(member, role, "code_o", [1], [2, 3], [-0.1, -0.1], 0.0, task=task, fixed_advantage=fixed)

    samples = ([sample("t0", "teacher", i) for i in range(6)] + [sample("s0", "student", i // 4) for i in range(12)]
               + [sample("s0", "student", 9, fixed=0.5)] + [sample("a0", "teacher", 0), sample("a0", "student", 0)])
    assert mark_kl_readout(samples, step=3, every=5, per_member=4) == 0 and not any(s.kl_readout for s in samples)
    assert mark_kl_readout(samples, step=10, every=5, per_member=4) == 4 + 4 + 1 + 1
    assert [i for i in range(6) if samples[i].kl_readout] == [0, 1, 3, 4]  # floor(i * 6 / 4)
    students = samples[6:18]
    assert [s.task for s in students if s.kl_readout] == [0, 0, 1, 2]  # indices 0, 3, 6, 9: spread over the tasks
    assert not samples[18].kl_readout  # a supervised target is not the policy's sample
    assert samples[19].kl_readout and samples[20].kl_readout  # the single agent: each role apart
    assert mark_kl_readout(samples, step=10, every=0, per_member=4) == 0
