"""glibc malloc settings for the evolution workload (a plain module: the league actor and the benchmark call it).

An operator on a 7B-shaped rank-64 adapter allocates ~600 MiB of child factors in blocks of 0.1-5 MiB. glibc
serves blocks above its mmap threshold with fresh ``mmap`` pages and unmaps them on ``free``, so every child
page-faults all of its memory in again (~155k faults, 0.15-0.2 s of a 0.7 s operator on two cores). With the
threshold at its maximum (32 MiB) and a high trim threshold, those blocks come from the heap and memory a
previous child freed is reused without faults; the cost is that the process keeps up to ``keep_bytes`` of
freed heap instead of returning it to the OS.

Threads: glibc gives a new thread its own arena, whose extra heaps (64 MiB each) are unmapped as soon as they
are empty, whatever the trim threshold. The operators' shards (``evolution.shards``) allocate the child
factors on pool threads, so with per-thread arenas every child still faulted 20-50k pages in again
(perturb 0.35 vs 0.30 s, dare 0.88 vs 0.86 s on two cores). One arena for the process (``M_ARENA_MAX`` 1;
the operators make a few thousand allocations per child, so there is no lock contention to speak of) keeps
all of it in the trimmed-by-threshold main heap. It applies to arenas created after the call: call it before
starting threads.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MAX_MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit (4 MiB * sizeof(long))


def reuse_freed_blocks(keep_bytes: int = 2 << 30) -> bool:
    """Serve blocks up to 32 MiB from the heap, keep up to ``keep_bytes`` of it when freed, one arena for all threads.

    Returns False (and changes nothing) where the C library is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return (bool(mallopt(M_MMAP_THRESHOLD, MAX_MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, min(keep_bytes, 2**31 - 1)))
            and bool(mallopt(M_ARENA_MAX, 1)))
