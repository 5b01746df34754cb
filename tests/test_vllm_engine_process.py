"""A hard-killed engine actor leaves no vLLM process behind.

On a GPU vLLM runs its engine core in a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, its default);
a core that outlived a SIGKILLed engine actor would keep the GPU memory the recovery's new engine needs. The CPU
path runs the core in-process (``inference.vllm_engine``), so this test turns the GPU's mode on for one engine actor
on vLLM's CPU build, kills the actor with SIGKILL and waits for its whole process tree to be gone. The shared-memory
segments of vLLM's message queues (``psm_*`` in /dev/shm, 160-240 MiB each) outlive the kill; the actor listed them
among its scratch while alive, and the node clean-up the system runs after a dead engine removes them (before, every
run of this test left 400 MiB in /dev/shm). Skipped where vLLM does not import (`bash install.sh cpu-vllm` installs
it; CI does).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import ray

from actors.cluster import NAMESPACE
from actors.node_cleanup import clean_node
from inference import vllm_available
from inference.shared_memory import SEGMENT_PREFIXES

pytestmark = [pytest.mark.vllm]


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (pid -> name), from /proc."""
    parent_of, names = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            parent_of[int(entry.name)], names[int(entry.name)] = int(rest[1]), name
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parent_of.items():
            if ppid == parent and child not in found:
                found[child] = names[child]
                frontier.append(child)
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_sigkilled_engine_actor_leaves_no_engine_core_process():
    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    if ray.is_initialized():
        pytest.skip("needs a Ray session of its own (one is already running in this process)")
    from tinycoder import ensure_model

    from actors.inference_actor import InferenceActor

    model = str(ensure_model("test", progress=False))
    before = set(Path("/dev/shm").glob("psm_*"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace=NAMESPACE, logging_level="WARNING",
             runtime_env={"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}})
    try:
        actor = InferenceActor.options(name="inference", num_cpus=1, max_restarts=0).remote(
            "vllm", model, max_adapters=2, max_lora_rank=8, dtype="float32", max_model_len=1024, engine_args={},
            seed=0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"), sleep_mode=False)
        assert ray.get(actor.backend.remote(), timeout=300) == "vllm"
        pid = ray._private.state.actors(actor._actor_id.hex())["Pid"]
        tree = descendants(pid)
        assert any(name.startswith("VLLM::EngineCor") for name in tree.values()), f"no engine core process: {tree}"
        _, scratch = ray.get(actor.scratch.remote(), timeout=60)
        segments = [p for p in scratch if p.startswith(SEGMENT_PREFIXES)]
        assert segments, scratch
        assert all(Path(p).exists() for p in segments), scratch
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while [p for p in tree if running(p)] and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {p: tree[p] for p in tree if running(p)}
        for p in left:  # do not leave them to the next test
            os.kill(p, signal.SIGKILL)
        assert not left, f"processes of the killed engine still running: {left}"
        assert all(Path(p).exists() for p in segments), "the kill itself removed the segments: nothing to check"
        ray.get(clean_node.remote(scratch), timeout=60)  # what System.stop runs on the dead engine's node
        assert not [p for p in scratch if Path(p).exists()], "left in /dev/shm after the clean-up"
        after = set(Path("/dev/shm").glob("psm_*"))
        assert after <= before, f"left in /dev/shm, not listed by the engine: {after - before}"
    finally:
        ray.shutdown()
