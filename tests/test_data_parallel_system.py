"""Data parallel over the learners (``rl.data_parallel``) on a real local Ray cluster: two learner replicas per
role step exactly as one learner per role.

Two systems of the tiny test model, started from placement plans: the reference with one learner per role
(data parallel off) and one with two learners per role (``resources.learner_gpus=2`` planned, then the plan's
learner GPUs dropped so the actors take their CPU path). The same hand-made rollouts (real token ids of the
model's vocabulary; rewards varying within each whitening group; one student drawing most of the samples, so
its samples are split across the replicas) train both for two steps. Checked:
- each member is held by both replicas of its role, which stay bit-identical, and equal the reference's
  adapters within lr / 50 (float summation order; AdamW is nearly blind to the gradient's scale, so the
  statistics, the pre-clip gradient norms among them, are compared too: rtol 1e-5);
- a checkpoint is written by one replica per role and restored into every replica: the step repeated after
  the restore lands on the same bits in both replicas as the uninterrupted step;
- the exported versions are what the engine serves (``check_versions``), and evolution puts the child into
  every replica.
A third system (epochs = 2) checks that ``finish_training`` compares the replicas after every apply: a
non-finite gradient on both replicas goes through as with one learner, a replica nudged on purpose is caught.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace

import pytest
import ray
import torch
from transformers import AutoTokenizer

from actors.cluster import NAMESPACE
from actors.driver import resolve_model
from actors.system import System
from configs import load_config
from learners.data_parallel import split_by_tokens
from planning.placement import plan_placement
from rollouts import Sample
from short_runs import SHORT

COMMON = SHORT + ["verifier.actors=1", "evolution.period=1", "evolution.protection_steps=0", "rl.grad_clip=0.05"]
LR = 5e-4  # the tiny preset's rl.learning_rate
WEIGHT_TOL = dict(atol=LR / 50, rtol=0.0)


@pytest.fixture(scope="module")
def ray_session():
    ray.init(address="local", num_cpus=max(4, os.cpu_count() or 1), namespace=NAMESPACE, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


def rollouts(vocab: int, seed: int) -> list[Sample]:
    """Two proposals per family of each teacher; twelve rollouts of s0 (long) and three of s1 (short)."""
    rng = random.Random(seed)

    def sample(member: str, role: str, family: str, answer: tuple[int, int], task: int | None = None) -> Sample:
        completion = [rng.randrange(4, vocab) for _ in range(rng.randint(*answer))]
        return Sample(member, role, family, [rng.randrange(4, vocab) for _ in range(rng.randint(6, 16))], completion,
                      [-1.0] * len(completion), rng.choice([0.0, 0.25, 0.5, 1.0]), task=task)

    out = [sample(m, "teacher", family, (4, 12)) for m in ("t0", "t1")
           for family in ("code_o", "code_i", "code_f") for _ in range(2)]
    out += [sample("s0", "student", ("code_o", "code_i")[i % 2], (10, 30), task=i // 2) for i in range(12)]
    out += [sample("s1", "student", "code_o", (3, 8), task=i) for i in range(3)]
    rng.shuffle(out)
    return out


def adapters(system: System) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Each member's PEFT tensors, one dict per learner holding it (its replicas)."""
    return {m: ray.get([l.state_dict.remote(m) for l in system.replicas_of(m)]) for m in sorted(system.owners)}


def assert_stats_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for member, stats in want.items():
        assert got[member].keys() == stats.keys()
        for key, value in stats.items():
            assert got[member][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (member, key)


@pytest.mark.slow  # ~40 s on two cores: two systems start (12 actors)
def test_two_learner_replicas_per_role_step_as_one_learner(ray_session, tmp_path):
    reference_config = load_config(None, COMMON)
    model_path = resolve_model(reference_config, progress=False)
    config = load_config(None, COMMON + ["rl.data_parallel=true", "resources.learner_gpus=2"])
    plan = plan_placement(config)
    plan.actors = [replace(a, num_gpus=0.0, gpu_ids=()) if a.role.startswith("learner") else a for a in plan.actors]
    assert plan.learner_shards == 2

    vocab = len(AutoTokenizer.from_pretrained(model_path))
    steps = [rollouts(vocab, seed) for seed in (1, 2)]
    for samples in steps:  # the replicas' split (learners.data_parallel.split_samples) cuts s0: its gradients are summed
        students = [s for s in samples if s.role == "student"]
        shares = split_by_tokens([len(s.prompt_ids) + len(s.completion_ids) for s in students], 2, [s.member for s in students])
        assert all(any(students[i].member == "s0" for i in share) for share in shares)

    reference = System.start(reference_config, plan_placement(reference_config), model_path)
    try:
        want_stats = [reference.train(samples) for samples in steps]
        want = adapters(reference)
    finally:
        reference.stop(release_shared_base=False)

    system = System.start(config, plan, model_path)
    try:
        assert {m: len(holders) for m, holders in system.owners.items()} == {"t0": 2, "t1": 2, "s0": 2, "s1": 2}
        assert_stats_close(system.train(steps[0]), want_stats[0])
        system.publish_adapters()  # from one replica per member; the engine serves exactly those versions (checked)
        checkpoint = tmp_path / "step-1"
        checkpoint.mkdir()
        system.checkpoint(checkpoint, 1)
        assert sorted(p.name for p in (checkpoint / "learners").iterdir()) == ["0", "2"], "one replica per role writes"
        assert_stats_close(system.train(steps[1]), want_stats[1])
        got = adapters(system)
        for member, replicas in got.items():
            assert replicas[0].keys() == want[member][0].keys()
            for key, tensor in want[member][0].items():
                assert torch.equal(replicas[0][key], replicas[1][key]), f"the replicas of {member} diverged at {key}"
                torch.testing.assert_close(replicas[0][key], tensor, **WEIGHT_TOL)

        system.restore(checkpoint)  # into both replicas, from the one that wrote
        system.train(steps[1])
        again = adapters(system)
        for member, replicas in got.items():
            for key in replicas[0]:
                assert all(torch.equal(replicas[0][key], r[key]) for r in again[member]), (member, key)

        events = system.evolve(step=2)
        assert events, "evolution is due every step with no protection"
        for event in events:
            child = adapters(system)[event["child"]]
            assert len(child) == 2 and all(torch.equal(child[0][k], child[1][k]) for k in child[0]), event["child"]
    finally:
        system.stop()


@pytest.mark.slow  # ~30 s on two cores: one system starts (6 actors), three steps of two epochs
def test_replicas_compared_after_every_apply(ray_session):
    """``finish_training`` compares the replicas' reports of every apply (``check_replicas``), epochs = 2, centred
    advantages, one system of two replicas per role:
    - s0's rewards of +-1e300 centre to advantages of +-inf (float32): a non-finite gradient on both replicas.
      The run goes on as with one learner: no error, s0 not stepped (bit-identical to before on both
      replicas), its statistics nan (equal as NaN == NaN once they crossed the object store), the others
      stepped; the next step trains s0;
    - one element of s1's weights nudged by 1e-3 in ONE replica (inside that actor, ``__ray_call__``): the next
      step's first apply reports different weights, and ``finish_training`` raises naming s1 and both learners."""
    config = load_config(None, COMMON + ["rl.data_parallel=true", "resources.learner_gpus=2", "rl.epochs=2",
                                         "rl.advantage_norm=center"])
    model_path = resolve_model(config, progress=False)
    plan = plan_placement(config)
    plan.actors = [replace(a, num_gpus=0.0, gpu_ids=()) if a.role.startswith("learner") else a for a in plan.actors]
    vocab = len(AutoTokenizer.from_pretrained(model_path))
    poisoned, sign = [], {}
    for s in rollouts(vocab, 3):  # both signs in each of s0's groups (role, family)
        if s.member == "s0":
            sign[s.family] = -sign.get(s.family, -1)
            s = replace(s, reward=1e300 * sign[s.family])
        poisoned.append(s)

    def nudge(actor, member: str) -> None:  # runs inside the learner actor
        with torch.no_grad():
            actor.model.slot_parameters(actor.slots[member])[0].view(-1)[0] += 1e-3

    system = System.start(config, plan, model_path)
    try:
        before = adapters(system)
        stats = system.train(poisoned)
        assert sorted(k for k, v in stats["s0"].items() if v != v) == ["advantage", "grad_norm", "loss", "pg_loss"]
        assert all(v == v for member in ("t0", "t1", "s1") for v in stats[member].values())
        after = adapters(system)
        for member, replicas in after.items():
            assert all(torch.equal(replicas[0][k], r[k]) for r in replicas for k in r), member
            moved = any(not torch.equal(replicas[0][k], before[member][0][k]) for k in replicas[0])
            assert moved == (member != "s0"), member
        system.train(rollouts(vocab, 4))
        assert not torch.equal(*(next(iter(adapters(system)["s0"][0].values())), next(iter(after["s0"][0].values()))))

        ray.get(system.replicas_of("s1")[1].__ray_call__.remote(nudge, "s1"))
        with pytest.raises(RuntimeError, match=r"the replicas of s1 hold different weights after the apply of epoch 1 of "
                                               r"2 \(parameter sum .*; on learner-student-0 \(share 0\) vs "
                                               r"learner-student-1 \(share 1\)\): they have diverged"):
            system.train(rollouts(vocab, 5))
    finally:
        system.stop()
