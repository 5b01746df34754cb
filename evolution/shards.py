"""Per-slot work split over the CPU's threads: contiguous shards of the slots, one single-threaded shard per thread.

An operator's heavy phases (Gram products, r x r factorisations, child products) are independent per slot.
Run as one sequence with MKL's two threads inside every product, the small operations between products
(torch dispatch, r x r float64 work, LAPACK on one thread) leave the second core idle about a fifth of the
time. Two shards of the slots on two Python threads, each with torch's intra-op threads at 1, keep both
cores busy: on two cores and the 7B shapes a child takes 17-28% less time (dare 1.09 -> 0.90 s, blend
0.99 -> 0.82 s, perturb 0.43 -> 0.35 s; old and new code interleaved in one process, docs/evolution.md).

The shards are contiguous in slot key order (layer-major), so each holds every module shape and its r x r
work still batches per shape. Random draws stay outside the shards, on the caller's thread in slot order, so
a child does not depend on how many threads made it (up to the last bits of the products).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

MIN_SLOTS_PER_SHARD = 8  # below this the threads cost more than they save


def in_shards(fn: Callable[[list[T]], R], items: Sequence[T], device: torch.device | None = None) -> list[R]:
    """``[fn(shard) for shard in shards]`` over contiguous shards of ``items``, concurrently on CPU.

    One shard per torch intra-op thread (fewer when there are under ``MIN_SLOTS_PER_SHARD`` items per
    shard); torch's intra-op thread count is 1 while they run and restored after. On other devices, or with
    one thread, ``fn`` gets all items as one shard. Results come back in shard order.
    """
    threads = torch.get_num_threads()
    count = min(threads, len(items) // MIN_SLOTS_PER_SHARD)
    if (device is not None and device.type != "cpu") or count < 2 or in_pool_thread():
        return [fn(list(items))]
    bounds = [round(i * len(items) / count) for i in range(count + 1)]
    shards = [list(items[bounds[i] : bounds[i + 1]]) for i in range(count)]
    torch.set_num_threads(1)
    try:
        return list(thread_pool(count).map(fn, shards))
    finally:
        torch.set_num_threads(threads)


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}


def in_pool_thread() -> bool:
    """True on a thread of ``thread_pool``: work there must not wait on the pools (they may be full)."""
    return threading.current_thread().name.startswith(_PREFIX)


_PREFIX = "evolution-pool"


def thread_pool(workers: int) -> ThreadPoolExecutor:
    """One long-lived pool per size and process, for every thread pool of the evolution code.

    glibc gives each thread its own malloc arena, and a fresh thread's arena returns what it freed to the OS:
    with a new pool per call every child page-faulted its ~600 MiB in again (~200k faults, all of the
    shards' gain). Long-lived threads keep reusing their arenas (``evolution.heap``)."""
    key = (os.getpid(), workers)  # a forked child must not use its parent's threads
    if key not in _POOLS:
        _POOLS[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=_PREFIX)
    return _POOLS[key]


def flat(parts: list[list[R]]) -> list[R]:
    """The shards' per-item results as one list, in item order."""
    return [item for part in parts for item in part]
