"""Landlock (Linux >= 5.13): an unprivileged process gives up file access, TCP and signals for good.

The fork server makes one ruleset that handles every access right the kernel knows and grants
none (``ruleset``); each child applies it to itself (``restrict``) before the program runs. From
then on the child cannot open, create, remove or execute any file (descriptors it already holds
still work), bind or connect TCP sockets (ABI >= 4), connect to abstract UNIX sockets or signal
a process outside its own Landlock domain (ABI >= 6). It needs ``PR_SET_NO_NEW_PRIVS`` (the fork
server sets it) and no privilege, so it holds where user namespaces are not allowed.
Standard library only.
"""

from __future__ import annotations

import os
import struct

from verifier.syscalls import LANDLOCK_CREATE_RULESET, LANDLOCK_RESTRICT_SELF, Kernel

CREATE_RULESET_VERSION = 1
# LANDLOCK_ACCESS_FS_* bits known to each ABI version: 13 in v1, +REFER in v2, +TRUNCATE in v3,
# +IOCTL_DEV in v5
FS_BITS_BY_ABI = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}
NET_BIND_CONNECT_TCP = 0b11  # ABI >= 4
SCOPE_ABSTRACT_UNIX_SOCKET_AND_SIGNAL = 0b11  # ABI >= 6


def abi(kernel: Kernel | None) -> int:
    """The Landlock ABI version of this kernel, 0 where there is none (or it is disabled)."""
    if kernel is None:
        return 0
    version = kernel.syscall(LANDLOCK_CREATE_RULESET, 0, 0, CREATE_RULESET_VERSION)
    return max(0, version)


def covers(version: int) -> dict[str, bool]:
    """What a ruleset of ``version`` stops."""
    return {"files": version >= 1, "tcp": version >= 4, "signals": version >= 6}


def ruleset(kernel: Kernel, version: int) -> int:
    """A ruleset descriptor that denies every right ``version`` knows; ``-errno`` on failure."""
    fs_bits = FS_BITS_BY_ABI.get(min(version, 5), 16)
    handled_fs = (1 << fs_bits) - 1
    handled_net = NET_BIND_CONNECT_TCP if version >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET_AND_SIGNAL if version >= 6 else 0
    if version >= 6:
        attr = struct.pack("=QQQ", handled_fs, handled_net, scoped)
    elif version >= 4:
        attr = struct.pack("=QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("=Q", handled_fs)
    fd = kernel.syscall_on_bytes(LANDLOCK_CREATE_RULESET, attr, len(attr), 0)
    if fd >= 0:
        os.set_inheritable(fd, True)
    return fd


def restrict(kernel: Kernel, ruleset_fd: int) -> int:
    """Apply the ruleset to the calling thread (and every process it creates); 0 or ``-errno``."""
    return kernel.syscall(LANDLOCK_RESTRICT_SELF, ruleset_fd, 0)
