"""Adapters move once, checkpoints stream from the learners: on a real local Ray cluster with the real
system (learners, two engine replicas, league, a verifier) over the tiny test model.

Counted with the object store's own counters (cumulative objects and bytes created in shared memory,
cluster-wide): publishing a version creates exactly one object of its size, however many replicas
load it, and the driver receives only references. The same counters show the old route (the driver
pulls the files and sends them to each replica) as one copy per replica plus the learner's, so the
count can fail.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import ray
import torch
from ray._private import internal_api
from safetensors.torch import load as load_safetensors

from actors.cluster import NAMESPACE
from planning.placement import plan_placement
from reporting.run_dir import RunDirectory
from actors.system import System
from configs import load_config
from learners.peft_io import CONFIG_NAME, WEIGHTS_NAME

REPLICAS = 2


def store_counters() -> tuple[int, int]:
    """(objects, bytes) ever created in the cluster's shared-memory object stores."""
    reply = internal_api.get_memory_info_reply(internal_api.get_state_from_address(ray.get_runtime_context().gcs_address))
    return reply.store_stats.cumulative_created_objects, reply.store_stats.cumulative_created_bytes


@pytest.fixture(scope="module")
def system():
    from tinycoder import ensure_model

    model = ensure_model("test", progress=False)
    config = load_config(None, ["model.tiny_variant=test", "verifier.actors=1"])
    plan = plan_placement(config)
    engine = plan.by_role("inference")[0]
    plan = replace(plan, actors=[replace(engine, name=f"inference-{i}") for i in range(REPLICAS)]
                   + [a for a in plan.actors if a.role != "inference"])
    ray.init(address="local", num_cpus=4, namespace=NAMESPACE, include_dashboard=False)
    try:
        running = System.start(config, plan, str(model))
        yield running
        running.stop()
    finally:
        ray.shutdown()


def learners(system: System) -> list:
    return [learner for shards in system.learners.values() for learner in shards]


def tensor_bytes(system: System, dtype: torch.dtype) -> int:
    """What the members' LoRA factors weigh in ``dtype``, counted from the learners' state dicts."""
    total = 0
    for learner in learners(system):
        for member in ray.get(learner.members.remote()):
            total += sum(t.numel() for t in ray.get(learner.state_dict.remote(member)).values()) * dtype.itemsize
    return total


def test_a_version_is_put_once_and_the_driver_sees_only_references(system):
    members = [m for learner in learners(system) for m in ray.get(learner.members.remote())]
    payload = tensor_bytes(system, torch.float32)  # tiny.yaml serves float32
    objects0, bytes0 = store_counters()
    system.publish_adapters(all_members=True)
    objects1, bytes1 = store_counters()
    assert objects1 - objects0 == len(members), "one object per published version, none per replica"
    assert payload <= bytes1 - bytes0 < payload * 1.05 + 8192 * len(members)  # headers and configs are small
    for replica in system.inference:
        assert ray.get(replica.adapters.remote()) == system.versions

    exported = ray.get(learners(system)[0].export.remote())  # what the driver receives: references only
    assert exported and all(isinstance(v, int) and isinstance(r, ray.ObjectRef) for v, (r,) in exported.values())

    # The old route, through the driver, counted the same way: the learner's copy plus one per replica.
    objects0, bytes0 = store_counters()
    for learner in learners(system):
        for member, (version, (ref,)) in ray.get(learner.export.remote()).items():
            files = {name: bytes(view) for name, view in ray.get(ref).items()}
            ray.get([r.load_adapter_files.remote(member, files, version) for r in system.inference])
    objects1, bytes1 = store_counters()
    assert objects1 - objects0 == (1 + REPLICAS) * len(members)
    assert bytes1 - bytes0 >= (1 + REPLICAS) * payload


def test_export_is_in_the_serving_dtype_and_the_engine_loads_it(system):
    learner = learners(system)[0]
    member = ray.get(learner.members.remote())[0]
    master = ray.get(learner.state_dict.remote(member))
    version, (ref,) = ray.get(learner.export.remote([member], "bfloat16"))[member]
    files = ray.get(ref)
    assert set(files) == {CONFIG_NAME, WEIGHTS_NAME} and not files[WEIGHTS_NAME].flags.writeable  # a shared view
    served = load_safetensors(bytes(files[WEIGHTS_NAME]))
    assert set(served) == set(master)
    for key, tensor in master.items():
        assert served[key].dtype == torch.bfloat16 and torch.equal(served[key], tensor.to(torch.bfloat16))
    ray.get([r.load_adapter_files.remote(member, ref, version + 100) for r in system.inference])
    assert {ray.get(r.adapters.remote())[member] for r in system.inference} == {version + 100}


def test_learners_write_and_restore_their_own_checkpoint_files(system, tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    flat = learners(system)
    member = ray.get(flat[0].members.remote())[0]
    saved = ray.get(flat[0].state_dict.remote(member))
    checkpoint = run.save_checkpoint(7, lambda d: system.checkpoint(d, 7))
    for i, learner in enumerate(flat):
        root = checkpoint / "learners" / str(i)
        assert {"optimizers.pt", "torch_rng.pt", "slots.json"} <= {p.name for p in root.iterdir()}
        for owned in ray.get(learner.members.remote()):
            weights = load_safetensors((root / "adapters" / owned / WEIGHTS_NAME).read_bytes())
            assert {t.dtype for t in weights.values()} == {torch.float32}  # checkpoints keep the master weights

    ray.get(flat[0].replace.remote(member, member, {k: torch.zeros_like(v) for k, v in saved.items()}))
    system.restore(checkpoint)
    restored = ray.get(flat[0].state_dict.remote(member))
    assert all(torch.equal(restored[k], saved[k]) for k in saved)


def test_a_learner_that_cannot_see_the_checkpoint_directory_fails_clearly(system, tmp_path):
    learner = learners(system)[0]
    elsewhere = tmp_path / "not-shared"  # what a learner on another node without the shared file system sees
    with pytest.raises(ray.exceptions.RayTaskError, match="cannot see the checkpoint directory") as err:
        ray.get(learner.checkpoint.remote(str(elsewhere), "0123", "learners/0"))
    assert "file system every node mounts" in str(err.value)
    assert not elsewhere.exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / ".checkpoint-id").write_text("another run's token")
    with pytest.raises(ray.exceptions.RayTaskError, match="holds another checkpoint's token"):
        ray.get(learner.restore.remote(str(tmp_path / "other"), "0123", "learners/0"))
    assert not Path(tmp_path / "other" / "learners").exists()


def test_the_store_adopts_a_written_directory_by_rename(tmp_path):
    import numpy as np

    from inference.adapter_store import AdapterStore, write_adapter_dir
    from inference.requests import AdapterLoadError

    store = AdapterStore(root=tmp_path)
    files = {CONFIG_NAME: b"{}", WEIGHTS_NAME: np.frombuffer(b"\x01\x02\x03", dtype=np.uint8)}  # bytes and views
    incoming = write_adapter_dir(files, tmp_path / "incoming")
    inode = (incoming / WEIGHTS_NAME).stat().st_ino
    live = store.publish("s0", incoming, 3, move=True)
    assert not incoming.exists() and (live / WEIGHTS_NAME).read_bytes() == b"\x01\x02\x03"
    assert (live / WEIGHTS_NAME).stat().st_ino == inode  # renamed, not copied
    copied = store.publish("s0", live, 4)
    assert live.exists() and (copied / WEIGHTS_NAME).stat().st_ino != inode
    with pytest.raises(AdapterLoadError, match="not a plain file name"):
        write_adapter_dir({"../escape": b""}, tmp_path / "bad")
    store.close()


def test_a_sample_of_a_member_no_learner_owns_is_an_error(system):
    from rollouts import Sample

    stray = Sample(member="s99", role="student", family="code_o", prompt_ids=[1, 2], completion_ids=[3],
                   logprobs=[-1.0], reward=1.0)
    # the module's tests share one system and may run on other workers in any order: start from engines
    # that serve the learners' versions, whatever an earlier test loaded into them
    system.publish_adapters(all_members=True)
    system.check_versions()
    with pytest.raises(RuntimeError, match=r"samples of \['s99'\], members no learner owns"):
        system.train([stray])
    with pytest.raises(ray.exceptions.RayTaskError, match="members it does not own"):  # a learner refuses too
        ray.get(learners(system)[0].train.remote([stray]))
    system.check_versions()  # the engines serve exactly the learners' versions
