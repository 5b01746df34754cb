"""What Ray's memory monitor says when it kills a worker, read from the error it raises (pure: no Ray import).

When a node's memory use passes ``memory_usage_threshold`` (``RAY_memory_usage_threshold``, default 0.95 of the
node's limit), the raylet kills a worker, and every call to an actor on it raises ``ray.exceptions.OutOfMemoryError``
whose message holds the node, the use against the threshold and the largest memory users, e.g.::

    1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 10.0.0.2, ID: ...)
    was 5.55GB used / 23.54GB limit (0.235613)
    OOM kill reason: Memory usage 5869674496B exceeded threshold of 5859093504B (23.2% of 25276502016B limit)
    ...
    Top 10 memory users: PID	MEM(GB)	COMMAND
    4985	1.89	/usr/bin/python ...

``memory_kill`` turns that into the few facts the driver logs and the threshold it waits under before it restarts
the actors (a restart into a node still above the threshold would only be killed again).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NODE = re.compile(r"Memory on the node \(IP: ([^,\s)]+)")
_REASON = re.compile(r"Memory usage (\d+)B exceeded threshold of (\d+)B \(([\d.]+)% of (\d+)B limit\)")
_USED = re.compile(r"was ([\d.]+GB used / [\d.]+GB limit)")
TOP_USERS = 5


@dataclass(frozen=True)
class MemoryKill:
    """One kill by Ray's memory monitor: the node, its use and threshold in bytes, the largest users (lines of
    ``PID MEM(GB) COMMAND``)."""

    node_ip: str
    used_bytes: int
    threshold_bytes: int
    limit_bytes: int
    used_text: str
    top_users: tuple[str, ...]

    def describe(self) -> str:
        users = "; ".join(self.top_users) if self.top_users else "none reported"
        return (f"Ray's memory monitor killed an actor on node {self.node_ip or '?'}: {self.used_text or '?'}, "
                f"threshold {self.threshold_bytes / 2**30:.2f} GiB of {self.limit_bytes / 2**30:.2f} GiB; "
                f"largest memory users (pid, GB, command): {users}")


def memory_kill(text: str) -> MemoryKill | None:
    """The memory monitor's facts in an error message, or None when ``text`` is not such a message."""
    reason = _REASON.search(text)
    if reason is None and "running low on memory" not in text:
        return None
    node = _NODE.search(text)
    used = _USED.search(text)
    users: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Top") and "memory users" in line:
            for row in lines[i + 1 :]:
                parts = row.split()
                if len(parts) < 3 or not parts[0].isdigit():
                    break
                users.append(f"{parts[0]} {parts[1]} {' '.join(parts[2:])[:60]}")
                if len(users) == TOP_USERS:
                    break
            break
    return MemoryKill(
        node_ip=node.group(1) if node else "",
        used_bytes=int(reason.group(1)) if reason else 0,
        threshold_bytes=int(reason.group(2)) if reason else 0,
        limit_bytes=int(reason.group(4)) if reason else 0,
        used_text=used.group(1) if used else "",
        top_users=tuple(users),
    )
