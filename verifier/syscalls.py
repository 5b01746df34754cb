"""The kernel calls the fork server needs that Python's ``os`` module lacks, bound once through libc.

``load()`` returns a ``Kernel``: plain callables over ctypes function pointers (``prctl``,
``unshare``, ``mount``, ``umount2``, raw ``syscall``), made in the fork server before it forks.
The server then drops ``ctypes`` from ``sys.modules``; a child calls these only while it confines
itself, before any program runs (a program that reached them anyway would trip the audit hook on
``ctypes.call_function``). Standard library only: the fork server runs without site-packages.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Callable

# syscall numbers by machine (x86-64 / aarch64); the landlock calls have one number everywhere
SYSCALL_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {"clone": 56, "capset": 126, "pivot_root": 155, "seccomp": 317, "keyctl": 250},
    "aarch64": {"clone": 220, "capset": 91, "pivot_root": 41, "seccomp": 277, "keyctl": 219},
}
LANDLOCK_CREATE_RULESET, LANDLOCK_RESTRICT_SELF = 444, 446

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
SECCOMP_SET_MODE_FILTER = 1
# Without this flag the kernel turns on Speculative Store Bypass mitigation for a filtered process,
# which made every run ~0.2 ms slower here (measured); a run holds no secret of another process.
SECCOMP_FILTER_FLAG_SPEC_ALLOW = 4
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = 1, 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5


class Kernel:
    """libc entry points; every call returns the raw result (``-1``/``-errno`` on failure, see each)."""

    def __init__(self, libc, ctypes) -> None:
        self.machine = os.uname().machine
        self.numbers = SYSCALL_NUMBERS.get(self.machine, {})
        get_errno = ctypes.get_errno
        raw = libc.syscall
        raw.restype = ctypes.c_long
        raw.argtypes = [ctypes.c_long] * 6
        prctl = libc.prctl
        prctl.restype = ctypes.c_int
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        unshare, mount, umount2 = libc.unshare, libc.mount, libc.umount2
        mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        buffer_address = ctypes.addressof
        make_buffer = ctypes.create_string_buffer
        fprog = type("sock_fprog", (ctypes.Structure,), {"_fields_": [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]})

        def syscall(number: int, *args: int) -> int:
            """A raw system call; ``-errno`` on failure."""
            padded = list(args) + [0] * (5 - len(args))
            result = raw(number, *padded)
            return result if result >= 0 else -get_errno()

        def syscall_on_bytes(number: int, data: bytes, *args: int) -> int:
            """A raw system call whose first argument points to a copy of ``data``."""
            buffer = make_buffer(data, len(data))
            return syscall(number, buffer_address(buffer), *args)

        def checked(result: int) -> int:
            return result if result >= 0 else -get_errno()

        self.syscall: Callable[..., int] = syscall
        self.syscall_on_bytes: Callable[..., int] = syscall_on_bytes
        self.prctl: Callable[..., int] = lambda option, a=0, b=0, c=0, d=0: checked(prctl(option, a, b, c, d))
        self.unshare: Callable[[int], int] = lambda flags: checked(unshare(flags))
        self.mount: Callable[..., int] = lambda source, target, fstype, flags, data: checked(
            mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags, data.encode() if data else None)
        )
        self.umount2: Callable[[str, int], int] = lambda target, flags: checked(umount2(target.encode(), flags))

        def bpf_loader(program: bytes, pid_offset: int) -> Callable[[int], int]:
            """A loader for ``program`` whose buffers are made now, once: called in a child with its
            pid, it writes the pid at ``pid_offset`` in place and installs the program (no ctypes
            objects are created per run, which would copy-on-write fault many pages)."""
            code = make_buffer(program, len(program))
            prog = fprog(len(program) // 8, buffer_address(code))
            prog_address = buffer_address(prog)
            view = memoryview(code).cast("B")

            number = self.numbers.get("seccomp")

            def load(pid: int) -> int:
                struct.pack_into("=I", view, pid_offset, pid)
                if number is not None:
                    result = syscall(number, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW, prog_address)
                    if result != -22:  # EINVAL: a kernel without the flag
                        return result
                return checked(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog_address, 0, 0))

            load.keep = (code, prog)  # type: ignore[attr-defined]
            return load

        self.bpf_loader: Callable[[bytes, int], Callable[[int], int]] = bpf_loader

        def capset_none() -> int:
            """Empty the effective, permitted and inheritable capability sets (capset, v3 header)."""
            header = make_buffer(struct.pack("=Ii", 0x20080522, 0), 8)
            data = make_buffer(bytes(24), 24)
            return syscall(self.numbers["capset"], buffer_address(header), buffer_address(data)) if "capset" in self.numbers else -38

        self.capset_none: Callable[[], int] = capset_none

        def pivot_root(new_root: str, put_old: str) -> int:
            new, old = make_buffer(new_root.encode()), make_buffer(put_old.encode())
            return syscall(self.numbers["pivot_root"], buffer_address(new), buffer_address(old)) if "pivot_root" in self.numbers else -38

        self.pivot_root: Callable[[str, str], int] = pivot_root


def load() -> Kernel | None:
    """The kernel calls, or None where libc cannot be loaded; drops ``ctypes`` from ``sys.modules``."""
    try:
        import ctypes

        return Kernel(ctypes.CDLL(None, use_errno=True), ctypes)
    except (ImportError, OSError, AttributeError):
        return None
    finally:
        for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
            del sys.modules[name]
