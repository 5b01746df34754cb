"""The unbiased pass@k estimator (Chen et al. 2021, used by evalplus, HumanEval and LiveCodeBench).

For a problem with ``n`` samples of which ``c`` are correct,

    pass@k = 1 - C(n - c, k) / C(n, k)          (= 1 when n - c < k)

and a benchmark's pass@k is the mean over its problems.
"""

from __future__ import annotations

from math import comb
from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) for one problem; raises ValueError unless 0 <= c <= n and 1 <= k <= n."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of ``pass_at_k(n, c, k)`` over problems given as (n, c) pairs (0.0 for no problems)."""
    if not counts:
        return 0.0
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
