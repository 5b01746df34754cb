"""A Ray head of a test's own: `ray start` under a private TMPDIR (where Ray records the cluster, so no other process
on the machine sees it) on free ports, and how to stop only it. `ray stop` would stop every Ray process on the
machine, other users' clusters included."""

from __future__ import annotations

import os
import socket

import psutil


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


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
