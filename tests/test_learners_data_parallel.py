"""Data parallel over an adapter (``learners.data_parallel``): a step split over K learners equals one learner's.

Reference: one ``PolicyLearner.step`` over all samples. Data parallel: K = 2 and 3 ``PolicyLearner``s built
from the same seed (identical adapters and fresh AdamW states), each training a share of the samples with the
whole step's advantages and token totals; per epoch the shares' gradients are summed in share order and every
replica applies the sum. Checked on a real tiny float32 Qwen2, no Ray:
- the summed gradient equals the one learner's gradient (within 1e-5 of its largest entry), epoch by epoch;
- after one and after two steps every replica's adapters are bit-identical to the other replicas' and equal
  the one learner's within atol lr / 50 (measured <= 0.0063 lr), with gradient clipping active, with epochs = 2
  (PPO ratio, KL, entropy), with a member absent from a step, on one share only, or a share with no sample;
  the statistics, the pre-clip gradient norms among them, equal the one learner's (rtol 1e-5). AdamW and
  clipping are nearly blind to a gradient's scale, so the norms and the gradient check above are what
  catch a scaled sum (a mean instead of a sum);
- share-local advantages and token totals would NOT be equal (the check is sensitive to what it guards);
- one share through the data-parallel calls is bit-identical to ``step``;
- ``split_by_tokens`` balances token sums (each share within the longest sample of T / K), deterministically,
  every sample once, splitting at most K - 1 members, each over consecutive shares;
- replicas are compared after every apply (``AdapterOptimizers.fingerprint``, ``check_replicas``): a weight or
  moment nudged in one replica is caught at the next apply, a non-finite gradient on every replica is not an
  error (the slot skips its step, nan statistics, as one learner).
"""

from __future__ import annotations

from dataclasses import replace

import pickle

import pytest
import torch
from transformers import AutoModelForCausalLM

from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample
from learners.data_parallel import (
    AppliedGradients, SlotGradients, check_replicas, split_by_tokens, step_targets, sum_gradients,
)
from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig
from learners.policy_learner import PolicyLearner, UpdateConfig, data_parallel_step
from test_learners_update import random_samples

PAD = 3
SLOTS = 3
LR = 1e-3
WEIGHT_TOL = dict(atol=LR / 50, rtol=0.0)  # measured <= LR * 0.0063

PLAIN = (PGConfig(), UpdateConfig(micro_batch_tokens=48))
PPO = (PGConfig(kl_coef=0.05, entropy_coef=0.01), UpdateConfig(epochs=2, micro_batch_tokens=48, batching="pack"))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: the learners here are tiny, and two threads on the shared 2-core machine spin-wait."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_learner(path, loss: PGConfig, update: UpdateConfig, grad_clip: float | None = 0.05,
                 device: str = "cpu") -> PolicyLearner:
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    model = MultiLoRAModel(base, LoRASpec(rank=4, alpha=8, num_slots=SLOTS), init_b_std=0.05, seed=0, device=device)
    return PolicyLearner(model, AdapterOptimizers(model, lr=LR, grad_clip=grad_clip), loss, update, PAD)


def draw_samples(vocab: int, seed: int, slots: list[int], n: int = 12) -> list[Sample]:
    """``random_samples`` (prompts of 2-8, completions of 1-11 tokens) with rewards in {-1, -0.5, 0, 0.5, 1} that
    vary within each of two advantage groups; every third in the KL readout (its sums add over the shares)."""
    return [replace(s, reward=((7 * i + seed) % 5) / 2 - 1.0, group=("solve", i % 2), kl_readout=i % 3 == 0)
            for i, s in enumerate(random_samples(n, vocab, slots, seed))]


def weights(learner: PolicyLearner) -> list[torch.Tensor]:
    return [p.detach().clone() for slot in range(SLOTS) for p in learner.model.slot_parameters(slot)]


def assert_replicas_equal_reference(reference: PolicyLearner, replicas: list[PolicyLearner]) -> None:
    expected = weights(reference)
    first = weights(replicas[0])
    for replica in replicas[1:]:
        assert all(torch.equal(a, b) for a, b in zip(first, weights(replica))), "replicas diverged"
    for got, want in zip(first, expected):
        torch.testing.assert_close(got, want, **WEIGHT_TOL)


def assert_grad_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within 1e-5 of the gradient's largest entry (float32 sums of a different order; measured <= 2e-6)."""
    torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().max()), rtol=0.0)


def assert_stats_close(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]]) -> None:
    assert set(got) == set(want)
    for slot in want:
        assert got[slot].keys() == want[slot].keys()
        for key, value in want[slot].items():
            assert got[slot][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (slot, key)


@pytest.mark.parametrize("config", [PLAIN, PPO], ids=["reinforce", "ppo_epochs2_kl_entropy"])
@pytest.mark.parametrize("k", [2, 3])
def test_split_step_equals_one_learner(tiny_qwen2, config, k):
    """Two steps (new samples each), clipping active: K replicas land on the one learner's adapters."""
    loss, update = config
    reference = make_learner(tiny_qwen2, loss, update)
    replicas = [make_learner(tiny_qwen2, loss, update) for _ in range(k)]
    vocab = reference.model.config.vocab_size
    # Step 1: a student-like member (slot 1) draws most samples; slot 2 only two.
    # Step 2: slot 0 absent (its replicas must keep their weights and state on every learner).
    for seed, slots in ((1, [0, 1, 1, 1, 2, 1]), (2, [1, 2, 1])):
        samples = draw_samples(vocab, seed, slots)
        shares = split_by_tokens([len(s) for s in samples], k, [s.slot for s in samples])  # data_parallel_step's default
        assert any(len({j for j, idx in enumerate(shares) for i in idx if samples[i].slot == slot}) > 1 for slot in slots), \
            "no member is split across shares: the test would not exercise the summation"
        want = reference.step(samples)
        got = data_parallel_step(replicas, samples)
        assert all(want[s]["grad_norm"] > 0.05 for s in want), "gradient clipping must be active in this test"
        assert_stats_close(got, want)
        assert_replicas_equal_reference(reference, replicas)


def test_summed_gradient_equals_one_learners_gradient(tiny_qwen2):
    """grad L_a = sum_k grad L_a^(k) with the global advantages and N_a, epoch by epoch (epochs = 2); with
    share-local advantages and token totals it is not (so the equality checks above guard them)."""
    loss, update = PPO
    reference = make_learner(tiny_qwen2, loss, update)
    replicas = [make_learner(tiny_qwen2, loss, update) for _ in range(3)]
    samples = draw_samples(reference.model.config.vocab_size, 3, [0, 1, 1, 2])
    assignment = split_by_tokens([len(s) for s in samples], 3, [s.slot for s in samples])
    targets = step_targets(samples)
    whole = reference.share(samples, targets.advantages, targets.slot_token_totals)
    shares = [r.share([samples[i] for i in idx], targets.advantages[idx], targets.slot_token_totals)
              for r, idx in zip(replicas, assignment)]
    for _ in range(update.epochs):
        want = whole.gradients()
        got = sum_gradients([share.gradients() for share in shares])
        assert set(got.grads) == set(want.grads) == {0, 1, 2}
        for slot in want.grads:
            assert_grad_close(got.grads[slot], want.grads[slot])
        reference.apply_gradients(want)
        for replica in replicas:
            replica.apply_gradients(got)
    assert_replicas_equal_reference(reference, replicas)

    # Share-local targets (what a learner would compute from its share alone) give another gradient.
    fresh = [make_learner(tiny_qwen2, loss, update) for _ in range(3)]
    whole = fresh[0].share(samples, targets.advantages, targets.slot_token_totals).gradients()
    local = []
    for learner, idx in zip(fresh, assignment):
        part = [samples[i] for i in idx]
        own = step_targets(part)
        local.append(learner.share(part, own.advantages, own.slot_token_totals).gradients())
    wrong = sum_gradients(local)
    with pytest.raises(AssertionError):
        for slot in whole.grads:
            assert_grad_close(wrong.grads[slot], whole.grads[slot])


def test_member_on_one_share_only(tiny_qwen2):
    """Slot 2's samples all on share 1 of 2, slot 0's all on share 0: the other share contributes nothing to
    them, yet both replicas step them identically (and equal to the one learner)."""
    loss, update = PPO
    reference = make_learner(tiny_qwen2, loss, update)
    replicas = [make_learner(tiny_qwen2, loss, update) for _ in range(2)]
    samples = draw_samples(reference.model.config.vocab_size, 4, [0, 1, 2, 1])
    by_slot = {slot: [i for i, s in enumerate(samples) if s.slot == slot] for slot in range(SLOTS)}
    ones = by_slot[1]
    assignment = [sorted(by_slot[0] + ones[: len(ones) // 2]), sorted(by_slot[2] + ones[len(ones) // 2:])]
    want = reference.step(samples)
    got = data_parallel_step(replicas, samples, assignment)
    assert_stats_close(got, want)
    assert_replicas_equal_reference(reference, replicas)
    # A share with no sample at all still applies the step on its replica.
    samples = draw_samples(reference.model.config.vocab_size, 5, [1, 2], n=4)
    want = reference.step(samples)
    got = data_parallel_step(replicas, samples, [list(range(4)), []])
    assert_stats_close(got, want)
    assert_replicas_equal_reference(reference, replicas)


def test_one_share_is_bit_identical_to_step(tiny_qwen2):
    loss, update = PPO
    reference = make_learner(tiny_qwen2, loss, update)
    replica = make_learner(tiny_qwen2, loss, update)
    samples = draw_samples(reference.model.config.vocab_size, 6, [0, 1, 1, 2])
    for _ in range(2):
        want = reference.step(samples)
        got = data_parallel_step([replica], samples)
        assert got == want
        assert all(torch.equal(a, b) for a, b in zip(weights(replica), weights(reference)))


def test_split_by_tokens_balances_and_splits_few_members():
    g = torch.Generator().manual_seed(0)
    # A student-heavy step: member "s0" draws 200 long sequences, four teachers 10 short ones each, interleaved.
    counts = torch.randint(20, 400, (200,), generator=g).tolist() + [30] * 40
    keys = ["s0"] * 200 + [f"t{i % 4}" for i in range(40)]
    order = torch.randperm(len(counts), generator=g).tolist()
    counts, keys = [counts[i] for i in order], [keys[i] for i in order]
    for k in (1, 2, 3, 5, 8):
        shares = split_by_tokens(counts, k, keys)
        assert shares == split_by_tokens(counts, k, keys)
        assert sorted(i for s in shares for i in s) == list(range(len(counts)))
        assert all(s == sorted(s) for s in shares)
        loads = [sum(counts[i] for i in s) for s in shares]
        assert all(abs(load - sum(counts) / k) <= max(counts) for load in loads), loads
        held = {key: sorted({j for j, s in enumerate(shares) for i in s if keys[i] == key}) for key in set(keys)}
        assert sum(len(js) > 1 for js in held.values()) <= k - 1, "more members split than cuts"
        assert all(js == list(range(js[0], js[-1] + 1)) for js in held.values()), "a member's shares must be consecutive"
    assert split_by_tokens([5, 3], 4) == [[], [0], [], [1]]
    assert split_by_tokens([0, 0], 2) == [[0, 1], []]
    with pytest.raises(ValueError, match="shares"):
        split_by_tokens([1], 0)


def test_slot_gradients_pickle_their_vectors_out_of_band():
    """What Ray's object store relies on to hold one copy that readers map: each slot's vector travels as an
    out-of-band buffer (pickle protocol 5), and the round trip gives the same values; summing mapped (read-only)
    vectors leaves them untouched."""
    grads = SlotGradients({0: torch.arange(6, dtype=torch.float32), 2: torch.ones(3)}, {0: {"tokens": 5.0}})
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(grads, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 2 and len(data) < 1000
    back = pickle.loads(data, buffers=[memoryview(b).toreadonly() for b in buffers])
    assert back.sums == grads.sums and all(torch.equal(back.grads[a], grads.grads[a]) for a in grads.grads)
    total = sum_gradients([back, back])
    assert torch.equal(total.grads[0], 2 * grads.grads[0]) and torch.equal(back.grads[0], grads.grads[0])


def test_each_replica_taking_its_share_of_all_samples_is_the_same_step(tiny_qwen2):
    """The actors' route (``PolicyLearner.share_of``: every replica gets ALL the samples and its index, and computes
    the targets and the split itself), epochs = 2: the one learner's step. No sample at all: empty shares, whose
    sum every replica applies without a change."""
    loss, update = PPO
    reference = make_learner(tiny_qwen2, loss, update)
    replicas = [make_learner(tiny_qwen2, loss, update) for _ in range(2)]
    samples = draw_samples(reference.model.config.vocab_size, 7, [0, 1, 1, 2])
    want = reference.step(samples)
    for batch in (samples, []):
        shares = [replica.share_of(batch, k, 2) for k, replica in enumerate(replicas)]
        for _ in range(update.epochs):
            summed = sum_gradients([share.gradients() for share in shares])
            got = [replica.apply_gradients(summed) for replica in replicas][0]
        assert_stats_close(got, want if batch else {})
        assert_replicas_equal_reference(reference, replicas)
    with pytest.raises(ValueError, match="the index must be in 0..1"):
        replicas[0].share_of(samples, 2, 2)


def through_the_object_store(grads: SlotGradients) -> SlotGradients:
    """What Ray does to a share's gradients between two actors: pickle protocol 5, buffers mapped read-only."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(grads, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=[memoryview(b).toreadonly() for b in buffers])


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
])
def test_replicas_on_a_device_exchanging_through_the_object_store_take_one_learners_step(tiny_qwen2, device):
    """The data-parallel actors' sequence on ``device`` (on CUDA: learners on the GPU, gradients exported to the
    CPU, pickled as the object store does, summed there and imported back): two steps with epochs = 2 equal
    one learner's steps on the same device (lr / 50), the replicas bit-identical, their adapters on ``device``."""
    loss, update = PPO
    reference = make_learner(tiny_qwen2, loss, update, device=device)
    replicas = [make_learner(tiny_qwen2, loss, update, device=device) for _ in range(2)]
    vocab = reference.model.config.vocab_size
    for seed, slots in ((8, [0, 1, 1, 2]), (9, [1, 2, 1, 1])):
        samples = draw_samples(vocab, seed, slots)
        want = reference.step(samples)
        shares = [replica.share_of(samples, k, 2) for k, replica in enumerate(replicas)]
        for _ in range(update.epochs):
            parts = [through_the_object_store(share.gradients()) for share in shares]
            assert all(g.device.type == "cpu" for part in parts for g in part.grads.values())
            got = [replica.apply_gradients(sum_gradients(parts)) for replica in replicas][0]
        assert_stats_close(got, want)
        assert_replicas_equal_reference(reference, replicas)
    assert all(p.device.type == device for slot in range(SLOTS) for p in replicas[0].model.slot_parameters(slot))


def slot_sums(learner: PolicyLearner, slot: int) -> dict[str, float]:
    """What ``AdapterOptimizers.fingerprint`` sums, computed here directly: every tensor of the slot concatenated
    on the CPU in float64."""
    params = learner.model.slot_parameters(slot)
    state = learner.optimizers.optimizers[slot].state

    def cat(tensors):
        return torch.cat([t.detach().cpu().double().reshape(-1) for t in tensors]) if tensors else torch.zeros(1, dtype=torch.float64)

    x = cat(params)
    return {"step": float(state[params[0]]["step"]) if params[0] in state else 0.0, "param_sum": float(x.sum()),
            "param_sq_sum": float((x * x).sum()), "exp_avg_sum": float(cat([state[p]["exp_avg"] for p in params if p in state]).sum()),
            "exp_avg_sq_sum": float(cat([state[p]["exp_avg_sq"] for p in params if p in state]).sum())}


@pytest.mark.parametrize("device", [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
])
def test_fingerprint_sums_what_each_slot_holds(tiny_qwen2, device):
    """``AdapterOptimizers.fingerprint``: per slot the AdamW step count and the float64 sums of the parameters
    (and their squares) and of the two moments, computed on ``device`` (the tensors stay there): before any step
    (no moments: 0) and after two, equal to the direct sums up to summation order."""
    loss, update = PLAIN
    learner = make_learner(tiny_qwen2, loss, update, device=device)
    before = learner.optimizers.fingerprint([2, 0])
    assert list(before) == [0, 2] and before[0]["step"] == before[0]["exp_avg_sum"] == before[0]["exp_avg_sq_sum"] == 0.0
    for seed in (1, 2):
        learner.step(draw_samples(learner.model.config.vocab_size, seed, [0, 1]))
    held = learner.optimizers.fingerprint(range(SLOTS))
    for slot in range(SLOTS):
        want = slot_sums(learner, slot)
        assert held[slot].keys() == want.keys()
        assert held[slot] == pytest.approx(want, rel=1e-12, abs=1e-15), slot
    assert held[0]["step"] == 2.0 and held[2]["step"] == 0.0 and held[0]["exp_avg_sq_sum"] > 0
    assert held[2]["param_sum"] == before[2]["param_sum"], "an absent slot is not stepped"
    assert all(p.device.type == device for p in learner.model.slot_parameters(0))


def test_a_perturbed_replica_is_caught_at_its_next_apply(tiny_qwen2):
    """A replica whose weights or AdamW moments were changed behind the step's back (one element, by a small
    amount) reports the same statistics as its healthy twin (computed from the same summed gradients), but its
    fingerprint differs from the next apply on: ``check_replicas`` names the member, the replicas and the quantity."""
    loss, update = PLAIN
    replicas = [make_learner(tiny_qwen2, loss, update) for _ in range(2)]
    vocab = replicas[0].model.config.vocab_size
    data_parallel_step(replicas, draw_samples(vocab, 10, [0, 1, 1, 2]))  # healthy: the replicas agree
    with torch.no_grad():
        replicas[1].model.slot_parameters(1)[0].view(-1)[0] += 1e-3
    samples = draw_samples(vocab, 11, [0, 1, 1, 2])
    shares = [replica.share_of(samples, k, 2) for k, replica in enumerate(replicas)]
    summed = sum_gradients([share.gradients() for share in shares])
    stats = [replica.apply_gradients(summed) for replica in replicas]
    assert stats[0] == stats[1], "the statistics cannot see it"
    reports = [AppliedGradients(f"replica {k}", 1, 1, replica.optimizers.fingerprint(summed.grads), stats[k])
               for k, replica in enumerate(replicas)]
    with pytest.raises(RuntimeError, match=r"the replicas of 1 hold different weights after the apply of epoch 1 of 1 "
                                           r"\(parameter sum .* vs .*; on replica 0 vs replica 1\): they have diverged"):
        check_replicas(reports)

    # AdamW moments (epochs = 2): caught at the first epoch's apply of the next step, by data_parallel_step itself.
    loss, update = PPO
    replicas = [make_learner(tiny_qwen2, loss, update) for _ in range(2)]
    data_parallel_step(replicas, samples)
    with torch.no_grad():
        replicas[0].optimizers.optimizers[2].state[replicas[0].model.slot_parameters(2)[3]]["exp_avg"].view(-1)[0] += 1e-7
    with pytest.raises(RuntimeError, match=r"the replicas of 2 hold different weights and optimizer states after the "
                                           r"apply of epoch 1 of 2 \(parameter sum .*, AdamW first-moment sum .*; on "):
        data_parallel_step(replicas, draw_samples(vocab, 12, [0, 1, 2, 2]))


def test_a_non_finite_gradient_on_every_replica_skips_the_step_as_one_learner_does(tiny_qwen2):
    """Slot 1's rewards of +-1e300 centre to advantages of +-inf in float32: its gradient is not finite on every
    share. Every replica skips slot 1's step as one learner does (weights and moments kept, the others stepped),
    the statistics carry nan where the one learner's do, and the replicas agree (NaN == NaN: the nan of one replica
    is not equal to the other's by ``!=`` once they are separate objects); the next, finite step trains slot 1."""
    loss, update = PGConfig(), UpdateConfig(micro_batch_tokens=48, advantage_norm="center")
    reference = make_learner(tiny_qwen2, loss, update)
    replicas = [make_learner(tiny_qwen2, loss, update) for _ in range(2)]
    vocab = reference.model.config.vocab_size
    samples = [replace(s, reward=1e300 if i % 4 < 2 else -1e300) if s.slot == 1 else s
               for i, s in enumerate(draw_samples(vocab, 13, [0, 1, 1, 1, 2, 1]))]
    def slot_1(learner: PolicyLearner) -> list[torch.Tensor]:
        return [p.detach().clone() for p in learner.model.slot_parameters(1)]

    kept = slot_1(reference)
    want = reference.step(samples)
    got = data_parallel_step(replicas, samples)  # checks the replicas: no error
    assert sorted(k for k, v in want[1].items() if v != v) == ["advantage", "grad_norm", "loss", "pg_loss"]
    assert sorted(k for k, v in got[1].items() if v != v) == sorted(k for k, v in want[1].items() if v != v)
    assert pickle.loads(pickle.dumps(got)) != got, "a plain comparison of the stats would call the replicas diverged"
    assert_stats_close({a: s for a, s in got.items() if a != 1}, {a: s for a, s in want.items() if a != 1})
    assert_replicas_equal_reference(reference, replicas)
    assert all(torch.equal(a, b) for a, b in zip(slot_1(replicas[0]), kept)), "slot 1 must not step"
    assert replicas[0].optimizers.fingerprint([1])[1]["step"] == 0.0
    samples = draw_samples(vocab, 14, [1, 1, 2])
    assert_stats_close(data_parallel_step(replicas, samples), reference.step(samples))
    assert_replicas_equal_reference(reference, replicas)
    assert not any(torch.equal(a, b) for a, b in zip(slot_1(replicas[0]), kept))


def test_check_replicas_compares_fingerprints_exactly_and_statistics_nan_aware():
    nan = float("nan")
    held = {"step": 3.0, "param_sum": 1.5, "param_sq_sum": 2.0, "exp_avg_sum": nan, "exp_avg_sq_sum": 0.0}

    def report(k: int, epoch: int, held_s0: dict, stats_s0: dict | None = None) -> AppliedGradients:
        return AppliedGradients(f"learner-{k} (share {k})", epoch, 2, {"s0": held_s0, "t0": dict(held)},
                                {"s0": stats_s0} if stats_s0 is not None else {})

    stats = {"loss": nan, "grad_norm": nan, "tokens": 12.0}
    check_replicas([report(k, e, dict(held), dict(stats) if e == 2 else None) for e in (1, 2) for k in range(2)])
    with pytest.raises(RuntimeError, match=r"replicas of s0 report different statistics after the apply of epoch 2 of 2 "
                                           r"\(tokens 12.0 vs 13.0; on learner-0 \(share 0\) vs learner-1 \(share 1\)\)"):
        check_replicas([report(0, 2, dict(held), dict(stats)), report(1, 2, dict(held), {**stats, "tokens": 13.0})])
    with pytest.raises(RuntimeError, match=r"replicas of s0 hold different optimizer states after the apply of epoch 1 "
                                           r"of 2 \(AdamW step count 3.0 vs 4.0; on learner-0 \(share 0\) vs learner-1 \(share 1\)\)"):
        check_replicas([report(0, 1, dict(held)), report(1, 1, {**held, "step": 4.0}),
                        report(0, 2, dict(held)), report(1, 2, {**held, "param_sum": 0.0})])
