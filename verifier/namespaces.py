"""Namespaces for a fork server and its runs: no host files, no network, no other processes.

``isolate`` runs once per fork server, after it has imported everything it will ever need, so
nothing later has to read a host file. It calls ``unshare`` for new user, mount, network, PID,
IPC and UTS namespaces (as root without the user namespace when that one is refused), then
forks: the parent stays outside as the *keeper* (it only waits, so the caller's process handle
stays valid) and the child goes on as the server, pid 1 of the new PID namespace. There the
server makes a fresh tmpfs its root with ``pivot_root`` and detaches the host's whole tree, then
remounts that root read-only. Runs, cloned later, live in these namespaces: an empty read-only
root, a network namespace with nothing but a down loopback, and a PID space holding the server,
its zygote and the one run in flight. Nothing is created per run, so the layer costs nothing per
run. Without root the server then drops every capability it holds in its user namespace; as root
it keeps them for the per-run chroot and uid change (a run loses them with its uid).

Where unprivileged user namespaces are refused, ``isolate`` reports why and changes nothing;
``HOW_TO_ENABLE`` names the settings. Standard library only.
"""

from __future__ import annotations

import os
import select
import signal

from verifier.syscalls import PR_CAPBSET_DROP, PR_SET_PDEATHSIG, Kernel

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CALLER_CHECK_S = 1.0  # how often the keeper looks whether its caller is still alive
RUNS_DIR = "/runs"  # as root: a writable tmpfs for the per-run chroot directories
HOW_TO_ENABLE = (
    "allow unprivileged user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` (Debian), "
    "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile granting `userns` "
    "(Ubuntu >= 23.10), `sysctl -w user.max_user_namespaces=15000` where it is 0; in a container, run it with "
    "a seccomp profile that allows unshare/clone of namespaces"
)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _unshare(kernel: Kernel, host_root: bool, uid_block: int) -> tuple[bool, str]:
    """Enter the new namespaces (all but PID take effect now); (user namespace used, error)."""
    base = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if host_root:
        # uid 0 and the block of per-run uids keep their host numbers; a mapping of more than one's
        # own uid must be written from the parent user namespace, by a helper forked before unshare
        maps = f"0 0 1\n{uid_block} {uid_block} 64\n"
        if _unshare_mapped_by_helper(kernel, base | CLONE_NEWUSER, maps):
            return True, ""
        return (False, "") if kernel.unshare(base) == 0 else (False, "unshare of namespaces failed")
    uid, gid = os.getuid(), os.getgid()
    result = kernel.unshare(base | CLONE_NEWUSER)
    if result != 0:
        return False, f"unshare of a user namespace with the others failed: {os.strerror(-result)}"
    # an ordinary user may map only itself: it becomes uid 0 of the namespace
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1\n")
    _write("/proc/self/gid_map", f"0 {gid} 1\n")
    return True, ""


def _unshare_mapped_by_helper(kernel: Kernel, flags: int, maps: str) -> bool:
    """unshare(flags) with the uid and gid maps written by a child left in the parent namespace."""
    ready_r, ready_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        code = 1
        try:
            if os.read(ready_r, 1) == b"u":
                server = os.getppid()
                _write(f"/proc/{server}/uid_map", maps)
                _write(f"/proc/{server}/gid_map", maps)
                code = 0
        finally:
            os._exit(code)
    os.close(ready_r)
    entered = kernel.unshare(flags) == 0
    os.write(ready_w, b"u" if entered else b"x")
    os.close(ready_w)
    _, status = os.waitpid(helper, 0)
    return entered and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _keep(child: int, host_pid_writer: int) -> None:
    """The keeper: tell the server its host pid, hold no other descriptor, wait, exit as it did.

    It also watches the caller (its parent) once every ``CALLER_CHECK_S``: when the caller is gone,
    the keeper kills the server (and with it, pid 1 of its namespace, every process inside), so
    nothing lingers when another process still holds the server's pipes open."""
    caller = os.getppid()
    os.write(host_pid_writer, child.to_bytes(8, "little"))
    for fd in range(0, 2):
        os.close(fd)
    os.closerange(3, host_pid_writer)
    os.closerange(host_pid_writer + 1, 1 << 20)
    try:
        exited = select.poll()
        exited.register(os.pidfd_open(child), select.POLLIN)
        while not exited.poll(int(CALLER_CHECK_S * 1000)):
            if os.getppid() != caller:
                os.kill(child, signal.SIGKILL)
                break
    except OSError:
        pass
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            status = 0
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 1)


def _pivot_to_empty_root(kernel: Kernel, runs_dir: bool) -> str:
    """Make a fresh tmpfs the root and detach the host's tree; '' or what failed."""
    if kernel.mount("none", "/", "", MS_REC | MS_PRIVATE, "") != 0:
        return "making the mounts private failed"
    target = next((d for d in ("/tmp", "/mnt", "/dev", "/proc") if os.path.isdir(d)), "/tmp")
    if kernel.mount("verifier-root", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555,size=64k,nr_inodes=16") != 0:
        return "mounting the empty root failed"
    os.chdir(target)
    if kernel.pivot_root(".", ".") != 0:
        return "pivot_root failed"
    if kernel.umount2(".", MNT_DETACH) != 0:
        return "detaching the host's root failed"
    os.chdir("/")
    if runs_dir:
        os.mkdir(RUNS_DIR, 0o711)  # the fresh root is still writable here
        if kernel.mount("verifier-runs", RUNS_DIR, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0711,size=1m") != 0:
            return "mounting the runs directory failed"
    if _remount_root_read_only(kernel) != 0:
        return "remounting the root read-only failed"
    return ""


def _remount_root_read_only(kernel: Kernel) -> int:
    return kernel.mount("none", "/", "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "")


def drop_capabilities(kernel: Kernel) -> bool:
    """Empty the bounding, ambient, effective, permitted and inheritable sets of the caller."""
    cap = 0
    while kernel.prctl(PR_CAPBSET_DROP, cap) == 0:
        cap += 1
    kernel.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    return kernel.capset_none() == 0


def isolate(kernel: Kernel, host_root: bool, uid_block: int, keep_capabilities: bool) -> dict:
    """Put the caller (the fork server) into fresh namespaces under an empty read-only root.

    Returns what it did: ``{"isolated": bool, "user_namespace": bool, "server_pid": host pid,
    "runs_dir": str | None, "capabilities_dropped": bool, "error": str}``. On success the caller
    is pid 1 of a new PID namespace; its parent, the keeper, never returns from here.
    """
    info = {"isolated": False, "user_namespace": False, "server_pid": os.getpid(), "runs_dir": None,
            "capabilities_dropped": False, "error": ""}
    userns, error = _unshare(kernel, host_root, uid_block)
    if error:
        info["error"] = error
        return info
    reader, writer = os.pipe()
    child = os.fork()
    if child:
        os.close(reader)
        _keep(child, writer)
    os.close(writer)
    # pid 1 now: die with the keeper (the caller's handle on us), and make sure it is still there
    kernel.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    head = os.read(reader, 8)
    os.set_blocking(reader, False)
    try:
        if os.read(reader, 1) == b"":
            os._exit(1)  # the keeper died before our death signal was armed
    except BlockingIOError:
        pass
    os.close(reader)
    info["server_pid"] = int.from_bytes(head, "little")
    info["user_namespace"] = userns
    runs_dir = host_root and keep_capabilities
    problem = _pivot_to_empty_root(kernel, runs_dir)
    if problem:
        raise OSError(f"verifier: could not build the empty root ({problem})")
    info["runs_dir"] = RUNS_DIR if runs_dir else None
    if not keep_capabilities:
        info["capabilities_dropped"] = drop_capabilities(kernel)
    info["isolated"] = True
    return info
