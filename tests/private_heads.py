"""A Ray head of a test's own: `ray start` under a private TMPDIR (where Ray records the cluster, so no other process
on the machine sees it) on free ports, and how to stop only it. `ray stop` would stop every Ray process on the
machine, other users' clusters included."""

from __future__ import annotations

import os
import random
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil


# Ray's own fixed ports sit below (GCS 6379, dashboard 8265, client 10001, workers 10002-19999).
_FIRST_TEST_PORT = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that are free now, drawn at random between Ray's fixed ports and the kernel's
    ephemeral range. A port the kernel hands out (binding port 0) can be taken again before the head binds it by any
    outgoing connection or any other Ray process's port-0 bind on the machine; ports below that range are taken only by
    an explicit bind, such as another test's head drawing the same number."""
    rng = random.SystemRandom()
    high = _ephemeral_low() - 1
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randint(_FIRST_TEST_PORT, high)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def start_head(command: Callable[[list[int]], list[str]], ports: int, tmpdir: str, env: dict[str, str],
               timeout: float, attempts: int = 3) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run ``command(free_ports(ports))`` (a ``ray start --head``) until it does not fail on a port taken in between,
    stopping what a failed start left under ``tmpdir``. Returns the last attempt and its ports."""
    for attempt in range(1, attempts + 1):
        chosen = free_ports(ports)
        start = subprocess.run(command(chosen), env=env, capture_output=True, text=True, timeout=timeout)
        if start.returncode == 0 or "already in use" not in start.stdout + start.stderr or attempt == attempts:
            return start, chosen
        stop_processes_under(tmpdir)
    raise ValueError(f"attempts must be >= 1, got {attempts}")


def stop_processes_under(tmpdir: str) -> None:
    """End the processes started with TMPDIR=``tmpdir`` or given it on their command line (``ray start --temp-dir``:
    the head's raylet, GCS, dashboard; a run's local cluster) and their children."""
    procs: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and (proc.environ().get("TMPDIR") == tmpdir
                                            or any(tmpdir in arg for arg in proc.cmdline())):
                procs[proc.pid] = proc
                procs.update((child.pid, child) for child in proc.children(recursive=True))
        except psutil.Error:
            pass
    for proc in procs.values():
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=3)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
