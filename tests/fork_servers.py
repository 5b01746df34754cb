"""The verifier's fork-server processes as the host sees them, for tests that attack or kill them."""

from __future__ import annotations

import psutil

from verifier import Verifier


def real_servers(v: Verifier) -> list[psutil.Process]:
    """The serving processes as the host sees them: in their own PID namespace each is pid 1, a child
    of the keeper that ``server.proc`` is (without namespaces, the same process)."""
    return [psutil.Process(s.hello["server_pid"]) for s in v._pool_for_use().servers]


def in_namespace(parent: psutil.Process, ns_pid: int) -> psutil.Process:
    """The child of ``parent`` whose pid inside its PID namespace is ``ns_pid`` (the last NSpid)."""
    for child in parent.children():
        with open(f"/proc/{child.pid}/status") as fh:
            nspid = next(line for line in fh if line.startswith("NSpid:")).split()[-1]
        if int(nspid) == ns_pid:
            return child
    raise LookupError(f"no child of {parent.pid} has pid {ns_pid} in its namespace")


def zygotes(v: Verifier) -> list[psutil.Process]:
    servers = v._pool_for_use().servers
    return [in_namespace(real, s.hello["zygote"]) for s, real in zip(servers, real_servers(v)) if s.hello.get("zygote")]


def children(servers: list[psutil.Process], zygotes: list[psutil.Process] = ()) -> list[psutil.Process]:
    """The runs in flight: children of the servers other than their zygotes."""
    skip = {z.pid for z in zygotes}
    return [run for server in servers for run in server.children() if run.pid not in skip]
