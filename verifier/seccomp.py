"""The seccomp filter every run loads: the system calls a pure-Python computation needs, nothing else.

``build()`` runs in the calling process (it needs ``pyseccomp``, a ctypes binding to libseccomp,
from site-packages) and returns the filter as classic BPF; the fork server receives those bytes
and each child loads them on itself (``install``, one ``prctl``) as the last step of its
confinement, after ``PR_SET_NO_NEW_PRIVS``. Building the program once keeps libseccomp's compiler
out of the per-run cost.

Allowed: reading and writing descriptors the run already holds (``fcntl`` only for the commands
of ``FCNTL_COMMANDS``: no run changes the flags, owner, signal or size of a descriptor), memory (``mmap``, ``brk``...),
signal handling of its own, clocks and sleeping, ids and its own limits, ``openat`` of directories
only (``O_DIRECTORY``, which fails on a file) and never for writing (no ``O_WRONLY``/``O_RDWR``/
``O_CREAT``/``O_TRUNC``/``O_APPEND``/``O_TMPFILE``), ``kill`` of its own process group only (pid 0),
``tgkill`` of its own threads only, and exiting. The modules a program may use are imported by the
fork server, so a run reads no file at all; on its own this layer still lets a run list directory
names and ``stat`` paths (the namespaces, Landlock and the chroot hide those). Everything else
fails with ``EPERM``: sockets, ``execve``, ``fork``/``clone``, ``ptrace``, ``mount``, ``unshare``,
``setns``, ``chroot``, uid changes, ``prctl``, ``bpf``, ``io_uring``, ``ioctl``, ``kill`` of any
other process, and ``fcntl``'s ``F_SETFL``/``F_SETOWN``/``F_SETSIG``/``F_SETPIPE_SZ`` (so no route
through a descriptor's signal owner either). ``EPERM`` rather than killing the process: the program sees an ordinary ``OSError``, so
its verdict (``RUNTIME_ERROR``, or ``FORBIDDEN`` when the Python layer saw the attempt first) says
what happened; a process of another architecture's calling convention is killed (libseccomp's
default for a foreign architecture).

``tgkill``'s own-pid rule is built with a placeholder pid (``placeholder_offsets`` finds it); the
server's loader (``verifier.syscalls.Kernel.bpf_loader``) writes each child's pid there (one 4-byte
constant, in place) before the child loads the program.
"""

from __future__ import annotations

import errno
import os
import struct
import tempfile

ALLOWED_SYSCALLS: tuple[str, ...] = (
    "read", "readv", "pread64", "write", "writev", "pwrite64", "lseek", "close", "fstat", "newfstatat", "stat",
    "lstat", "statx", "fstatfs", "readlink", "readlinkat", "access", "faccessat", "faccessat2", "getdents64",
    "getcwd", "mmap", "munmap", "mremap", "mprotect", "brk", "madvise", "membarrier", "futex",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "restart_syscall", "getpid", "gettid",
    "getppid", "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid", "getsid",
    "getpgid", "getpgrp", "getrusage", "getrlimit", "times", "sysinfo", "uname",
    "clock_gettime", "clock_getres", "gettimeofday", "time", "clock_nanosleep", "nanosleep", "sched_yield",
    "sched_getaffinity", "getrandom", "rseq", "set_robust_list", "exit", "exit_group",
)
# The fcntl commands a run may use: duplicating a descriptor and reading or setting close-on-exec
# and reading the status flags. Everything that changes an open file description shared with
# another process (F_SETFL's O_ASYNC/O_NONBLOCK, F_SETOWN/F_SETOWN_EX/F_SETSIG, F_SETPIPE_SZ,
# leases, locks, notifications) fails. An allow-list of commands, not a rule about one
# descriptor: a rule keyed on a descriptor number is bypassed by duplicating it.
FCNTL_COMMANDS: tuple[int, ...] = (0, 1, 2, 3, 1030)  # F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_DUPFD_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | 0o20000000  # the last: __O_TMPFILE
PID_PLACEHOLDER = 0x7A5B3C1D  # in tgkill's rule; replaced by the child's pid before loading
DENIED_ERRNO = errno.EPERM


def build() -> bytes:
    """The filter as classic BPF (8-byte instructions) for this machine; raises ImportError without
    pyseccomp and OSError where libseccomp refuses."""
    import pyseccomp as sc  # noqa: PLC0415 (host side only; the fork server never imports it)

    flt = sc.SyscallFilter(sc.ERRNO(DENIED_ERRNO))
    for name in ALLOWED_SYSCALLS:
        try:
            flt.add_rule(sc.ALLOW, name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a system call of this architecture (e.g. "open" on aarch64)
    for name, flags_arg in (("openat", 2), ("open", 1)):
        try:  # directories only (O_DIRECTORY fails on anything else), never for writing
            flt.add_rule(sc.ALLOW, name, sc.Arg(flags_arg, sc.MASKED_EQ, WRITE_FLAGS | os.O_DIRECTORY, os.O_DIRECTORY))
        except (OSError, ValueError, RuntimeError):
            continue
    for command in FCNTL_COMMANDS:
        flt.add_rule(sc.ALLOW, "fcntl", sc.Arg(1, sc.EQ, command))
    flt.add_rule(sc.ALLOW, "prlimit64", sc.Arg(0, sc.EQ, 0))  # its own limits only (a root run may not touch others')
    flt.add_rule(sc.ALLOW, "kill", sc.Arg(0, sc.EQ, 0))
    flt.add_rule(sc.ALLOW, "tgkill", sc.Arg(0, sc.EQ, PID_PLACEHOLDER))
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        program = fh.read()
    placeholder_offsets(program)  # checks the placeholder is there exactly once
    return program


def placeholder_offsets(program: bytes) -> list[int]:
    """Byte offsets of the ``k`` fields that hold ``PID_PLACEHOLDER`` (exactly one expected)."""
    offsets = [i + 4 for i in range(0, len(program), 8) if struct.unpack_from("=I", program, i + 4)[0] == PID_PLACEHOLDER]
    if len(offsets) != 1:
        raise ValueError(f"the seccomp program holds the pid placeholder {len(offsets)} times, expected once")
    return offsets
