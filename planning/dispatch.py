"""How one batch of generation requests is cut into pieces for the engine replicas (``System.generate``).

The rule (policy ``queue``, the system's): with R > 1 replicas the requests are cut, in request order, into
``PIECES_PER_REPLICA`` x R contiguous pieces of equal count; each replica is handed one piece to run and one to
queue (calls to a synchronous actor run in order, so it never waits between pieces), and whenever a replica
returns a piece it gets the next one. The results go back in request order. One replica gets everything in one
call, as before.

Why: the phase ends when the last replica does. An even split (policy ``even``: one contiguous chunk per
replica, what the system did before) makes the phase wait for whichever replica drew the long completions,
unknown beforehand; with k pieces per replica a replica that drew long ones simply takes fewer pieces. What is
left is the tail of list scheduling: replicas stop within about one piece of each other, so the phase takes
the balanced ideal W / R (W: every replica's busy seconds together) plus at most about (1 - 1 / R) pieces,
W / (R k) each on average (:func:`imbalance_s`, the time plan's term; a queued piece is committed to its
replica, so an unlucky one can add a second). Why not smaller pieces: each piece is one engine batch, and a
batch decodes its rows together, so fewer rows per batch run at a lower throughput (vLLM's continuous batching
above all), and every piece costs a round trip to the actor; k = 4 keeps each piece a quarter of a replica's
share.

Policy ``longest_first`` (balance by expected length): the requests sorted by their expected cost, longest
first (stable: equal costs keep request order), then cut into the same pieces, so the long pieces start first
and the last ones handed out are short, and each piece holds requests of like length (a batch runs as long
as its longest row). The system's requests of one call share ``max_tokens`` and ``n``, so their expected cost
(:func:`expected_cost`) is equal and this order is the request order; it pays only where costs differ.

Which replica serves a request changes nothing it samples: each request carries its own seed (from its index in
the step, ``System.seed``) and adapter, and the engines draw each row from its own generator. Whether the
logits themselves are independent of the batch a row is in is the engine's matter (docs/inference.md).

Pure arithmetic, no Ray and no torch: ``actors.system`` applies it, ``planning.time_plan`` plans its tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the inference package imports torch; the time plan imports this module and stays without it
    from inference.requests import GenerationRequest

PIECES_PER_REPLICA = 4
"""k: pieces per replica of one batch (module docstring: a quarter of a replica's share per piece)."""

Policy = Literal["queue", "even", "longest_first"]
POLICIES: tuple[str, ...] = ("queue", "even", "longest_first")


def expected_cost(request: "GenerationRequest") -> float:
    """A request's expected work in new tokens, for ``longest_first``: its ``n`` rows of at most ``max_tokens``
    each (the longest a row may run; the driver knows no more before the engine runs it)."""
    return float(request.n * request.max_tokens)


def pieces(costs: Sequence[float], replicas: int, policy: Policy = "queue",
           per_replica: int = PIECES_PER_REPLICA) -> list[list[int]]:
    """The pieces of a batch of ``len(costs)`` requests for ``replicas`` replicas: lists of request indices, in the
    order they are handed out (module docstring). ``costs`` (expected work per request) order only ``longest_first``.

    ``even``: ``replicas`` contiguous chunks of ceil(n / R); ``queue``: ``per_replica`` x R contiguous pieces whose
    sizes differ by at most one; ``longest_first``: the same sizes over the requests sorted by cost, descending.
    One replica: one piece of everything. No empty pieces."""
    if replicas < 1 or per_replica < 1:
        raise ValueError(f"replicas ({replicas}) and pieces per replica ({per_replica}) must be at least 1")
    if policy not in POLICIES:
        raise ValueError(f"unknown dispatch policy {policy!r}; use one of {', '.join(POLICIES)}")
    n = len(costs)
    if n == 0:
        return []
    if replicas == 1:
        return [list(range(n))]
    if policy == "even":
        size = -(-n // replicas)
        return [list(range(start, min(start + size, n))) for start in range(0, n, size)]
    order = sorted(range(n), key=lambda i: -costs[i]) if policy == "longest_first" else list(range(n))
    count = min(n, replicas * per_replica)
    bounds = [n * j // count for j in range(count + 1)]
    return [order[bounds[j]:bounds[j + 1]] for j in range(count)]


def imbalance_s(work_s: float, replicas: int, per_replica: int = PIECES_PER_REPLICA) -> float:
    """Seconds the work queue's phase is expected to take beyond the balanced ideal ``work_s / replicas``:

        (1 - 1 / R) x W / (R k)

    with W = ``work_s`` the batch's work on one replica (all replicas' busy seconds together), R replicas, k pieces
    per replica: list scheduling's tail, one mean piece W / (R k) on every replica but the one that ends first
    (Graham's bound with the mean piece for the longest). 0 with one replica."""
    if replicas <= 1:
        return 0.0
    return (1.0 - 1.0 / replicas) * work_s / (replicas * per_replica)
