"""The POSIX shared-memory segments an engine's processes map, so a crash does not leave them behind.

vLLM's message queues between its processes (``MessageQueue`` over ``multiprocessing.shared_memory``) live in
``/dev/shm`` as ``psm_<random>``, 160-240 MiB each, and are unlinked only by a clean shutdown. A SIGKILLed engine
(OOM, a node's watchdog, a test) leaves them: RAM that nothing frees until the machine restarts, one set per
crash. Which segments belong to which engine is not in their names, so they are read from where the processes
map them (``/proc/PID/maps`` of the engine's process and its descendants, the engine core among them) while the
engine lives; the system removes them on the engine's node when the engine dies (``actors.node_cleanup``).
"""

from __future__ import annotations

from pathlib import Path

SEGMENT_PREFIXES = ("/dev/shm/psm_",)
"""Python's ``multiprocessing.shared_memory`` segments, which vLLM's queues use. A killed engine also leaves one
named semaphore of ``multiprocessing`` (``sem.mp-*``, 32 bytes), created where no process of the engine maps it
while it lives, so it cannot be told from another engine's: it stays."""


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it (empty where the process is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid] + [child.pid for child in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def mapped_segments(pid: int, prefixes: tuple[str, ...] = SEGMENT_PREFIXES) -> list[str]:
    """Paths starting with one of ``prefixes`` that ``pid`` or a descendant maps (Linux ``/proc``; empty elsewhere)."""
    found: set[str] = set()
    for each in process_tree(pid):
        try:
            lines = Path(f"/proc/{each}/maps").read_text().splitlines()
        except OSError:  # exited meanwhile, or no /proc (macOS)
            continue
        for line in lines:  # address perms offset dev inode [path]
            fields = line.split(maxsplit=5)
            path = fields[5] if len(fields) == 6 else ""
            if path.startswith(prefixes) and not path.endswith(" (deleted)"):  # an unlinked one is not left behind
                found.add(path)
    return sorted(found)
