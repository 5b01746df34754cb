"""How one batch of generation requests is cut into pieces for the engine replicas (``System.generate``).

The rule (policy ``queue``, the system's): with R > 1 replicas the requests are cut, in request order, into
contiguous pieces of equal count, the same number for every replica (:func:`piece_count`: up to
``PIECES_PER_REPLICA``, none below a replica's full batch, ``replica_batch_rows``: the engines' batch cap unless vLLM's
``max_num_seqs`` says otherwise); each replica is handed one piece to run and one to queue (calls to a synchronous
actor run in order, so it never waits between pieces), and whenever a replica returns a piece it gets the next
one. The results go back in request order. One replica gets everything in one call, as before; a batch of less
than two full batches per replica goes out as the even split (policy ``even``: one contiguous chunk per replica,
what the system did before).

Why pieces: the phase ends when the last replica does, and an even split makes it wait for whichever replica drew
the long completions, unknown beforehand; with k pieces per replica a replica that drew long ones takes fewer
pieces. What is left is the tail of list scheduling, the replicas' last pieces ending within about one piece of
each other: the balanced ideal W / R (W: every replica's busy seconds together) plus about (1 - 1 / R) half pieces
of W / (R k) (:func:`imbalance_s`, the time plan's term; a queued piece is committed to its replica, so an unlucky
one can add more). Why the floor: a batch's rows decode together and a decode step costs about as much for a few
rows as for a full batch, so pieces below a full batch, run one after another, cost about a full batch's time
each. Measured on the transformers engine (``bench/replica_balance.py``, docs/inference.md, pieces without the
floor): 4 pieces per replica of a 32-request batch took 1.7x (uniform) and 2.2x (skewed) the even split's time,
while finishing within 4-7% of their own ideal.

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
from typing import TYPE_CHECKING, Any, Literal

from planning.memory_plan import HF_MAX_BATCH_ROWS, VLLM_DEFAULT_MAX_NUM_SEQS

if TYPE_CHECKING:  # the inference package imports torch; the time plan imports this module and stays without it
    from inference.requests import GenerationRequest

PIECES_PER_REPLICA = 4
"""k: the most pieces per replica of one batch (module docstring: a quarter of a replica's share per piece)."""

Policy = Literal["queue", "even", "longest_first"]
POLICIES: tuple[str, ...] = ("queue", "even", "longest_first")


def expected_cost(request: "GenerationRequest") -> float:
    """A request's expected work in new tokens, for ``longest_first``: its ``n`` rows of at most ``max_tokens``
    each (the longest a row may run; the driver knows no more before the engine runs it)."""
    return float(request.n * request.max_tokens)


def replica_batch_rows(config: Any) -> int:
    """The rows one engine replica of ``config`` decodes at once: ``inference.vllm_engine_args.max_num_seqs`` where
    set, else the engines' own caps (the transformers engine's ``HF_MAX_BATCH_ROWS``, vLLM's default
    ``max_num_seqs``; the smaller, so that a piece is never under a full batch of either)."""
    default = min(HF_MAX_BATCH_ROWS, VLLM_DEFAULT_MAX_NUM_SEQS)
    return int(config.inference.vllm_engine_args.get("max_num_seqs", default))


def piece_count(requests: int, replicas: int, per_replica: int = PIECES_PER_REPLICA, rows: int | None = None,
                min_rows: int = 0) -> int:
    """How many pieces ``queue`` and ``longest_first`` cut a batch of ``requests`` (``rows`` rows in all) into:

        min(requests, R x min(k, max(1, rows // (R x min_rows))))      (min_rows 0: min(requests, R k))

    so every replica gets the same number of pieces and none holds fewer than ``min_rows`` rows (a replica's full
    batch), else one piece per replica, the even split. A replica decodes a batch's rows together, a step costing
    about the same for a few rows as for a full batch, so pieces below a full batch, run one after another, cost a
    full batch's time each (bench/replica_balance.py measured it); and R + 1 full pieces would leave one replica
    two pieces while the others hold one."""
    if min_rows > 0 and rows is not None:
        per_replica = min(per_replica, max(1, rows // (replicas * min_rows)))
    return min(requests, replicas * per_replica)


def pieces(costs: Sequence[float], replicas: int, policy: Policy = "queue", per_replica: int = PIECES_PER_REPLICA,
           rows: Sequence[int] | None = None, min_rows: int = 0) -> list[list[int]]:
    """The pieces of a batch of ``len(costs)`` requests for ``replicas`` replicas: lists of request indices, in the
    order they are handed out (module docstring). ``costs`` (expected work per request) order only ``longest_first``;
    ``rows`` (rows per request, its ``n``; default 1 each) and ``min_rows`` bound the count (:func:`piece_count`).

    ``even``: ``replicas`` contiguous chunks of ceil(n / R); ``queue``: :func:`piece_count` contiguous pieces whose
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
    count = piece_count(n, replicas, per_replica, sum(rows) if rows is not None else n, min_rows)
    bounds = [n * j // count for j in range(count + 1)]
    return [order[bounds[j]:bounds[j + 1]] for j in range(count)]


def imbalance_s(work_s: float, replicas: int, pieces_per_replica: float = PIECES_PER_REPLICA) -> float:
    """Seconds the work queue's phase is expected to take beyond the balanced ideal ``work_s / replicas``:

        (1 - 1 / R) x W / (2 R k)

    with W = ``work_s`` the batch's work on one replica (all replicas' busy seconds together), R replicas, k the
    pieces per replica (``piece_count / R``): list scheduling's tail, half a mean piece W / (R k) on every replica but
    the one that ends first (the replicas' last pieces end spread over about one piece; Graham's bound, a whole
    longest piece, is twice this and more). bench/replica_balance.py measured 1.04-1.07 x the ideal where this says
    1.0625 (2 replicas, 4 pieces each). 0 with one replica or one piece per replica (the even split, whose spread
    the time plan's longest-row tail stands for)."""
    if replicas <= 1 or pieces_per_replica <= 1:
        return 0.0
    return (1.0 - 1.0 / replicas) * work_s / (2 * replicas * pieces_per_replica)
