"""Reading Ray's memory-monitor errors (the message as Ray 2.60 raises it on a call to a killed actor), and which
Ray errors the driver recovers from."""

from __future__ import annotations

from actors.driver import is_actor_fault, memory_kill_of
from actors.memory_kills import memory_kill

MESSAGE = (
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 10.0.0.7, ID: 662cbb4a) "
    "was 5.55GB used / 23.54GB limit (0.235613)\n"
    "OOM kill reason: Memory usage 5869674496B exceeded threshold of 5859093504B (23.2% of 25276502016B limit)\n"
    "Object store memory usage: [- objects spillable: 0\n- bytes spillable: 0]\n"
    "Ray killed 1 worker(s) based on the killing policy\n"
    "To see more information about memory usage on this node, use `ray logs raylet.out -ip 10.0.0.7`\n"
    "Top 10 memory users: PID\tMEM(GB)\tCOMMAND\n"
    "4985\t1.89\t/usr/bin/python -m tinycoder --here\n"
    "15876\t0.10\tray::inference:InferenceActor.__init__\n"
    "Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/...\n"
)


def test_the_memory_monitors_facts_are_read_from_its_message():
    kill = memory_kill(MESSAGE)
    assert kill is not None
    assert (kill.node_ip, kill.used_bytes, kill.threshold_bytes, kill.limit_bytes) == (
        "10.0.0.7", 5869674496, 5859093504, 25276502016)
    assert kill.top_users == ("4985 1.89 /usr/bin/python -m tinycoder --here", "15876 0.10 ray::inference:InferenceActor.__init__")
    text = kill.describe()
    assert "5.55GB used / 23.54GB limit" in text and "threshold 5.46 GiB" in text and "4985 1.89" in text
    assert memory_kill("ActorDiedError: the actor died unexpectedly") is None


def test_rays_ways_of_losing_an_actor_are_actor_faults():
    from ray.exceptions import ActorDiedError, NodeDiedError, ObjectLostError, OutOfMemoryError, RayTaskError, WorkerCrashedError

    for exc in (OutOfMemoryError(MESSAGE), WorkerCrashedError(), NodeDiedError("node gone"), ActorDiedError(),
                ObjectLostError("0" * 56, "owner", "call site")):
        assert is_actor_fault(exc), type(exc).__name__
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = OutOfMemoryError(MESSAGE)
    assert is_actor_fault(wrapped) and memory_kill_of(wrapped).node_ip == "10.0.0.7"
    assert not is_actor_fault(ValueError("a bug of ours")) and memory_kill_of(ValueError("x")) is None
    assert not is_actor_fault(RayTaskError("f", "traceback", ValueError("a bug in a task")))
