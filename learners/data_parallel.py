"""Data parallel over an adapter: one member's samples split across K learners, gradients summed, one step.

The step of :class:`learners.policy_learner.PolicyLearner` minimises, for every adapter a present,

    L_a = (1 / N_a) sum_{t in a} l_t(A_{i(t)})         (N_a: a's completion tokens in the WHOLE step)

with advantages A_i whitened per (slot, group) over ALL of a's samples of the step. Both are global: a
share's own N_a or its own whitening would change the loss. So they are computed once over every sample
(:func:`step_targets`), each share S_k trains its samples with those advantages and the global N_a, and
since L_a = sum_k L_a^{(k)} (the token sum splits over shares, the divisor is fixed),

    grad L_a = sum_k grad L_a^{(k)}.

Each share exports its per-slot gradients (:class:`SlotGradients`, one flat float32 vector per slot), they
are summed in a fixed order (:func:`sum_gradients`, share 0 first: deterministic), and every replica of the
member applies that same sum with its own copy of the AdamW state, clipping included (replicated optimizer
state, as DDP), so replicas stay bit-identical and equal one learner's step up to float summation order.
With epochs > 1 the exchange is per epoch (the next epoch's forward needs the stepped weights).
After every apply each replica reports what it holds of the members it stepped (:class:`AppliedGradients`,
``AdapterOptimizers.fingerprint``) and :func:`check_replicas` compares them: a replica that diverged is an error.

:func:`split_by_tokens` assigns samples to K shares so that every share computes about the same tokens
whatever the members draw, splitting at most K - 1 members (the others need no gradient exchange). No Ray here: the actor shell moves :class:`SlotGradients` through the object store.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import torch

from learners.batching import Sample
from learners.multi_lora import MultiLoRAModel
from learners.pg_loss import group_normalised_advantages


@dataclass(frozen=True)
class StepTargets:
    """What a step's loss needs from ALL its samples: per-sample advantages and per-slot token totals N_a.

    ``advantages[i]`` belongs to ``samples[i]`` of the list it was computed from (take ``advantages[idx]``
    for a share ``idx``); ``slot_token_totals[a]`` = sum of ``len(s.completion_ids)`` over slot a's samples.
    """

    advantages: torch.Tensor
    slot_token_totals: dict[int, float]


def step_targets(samples: Sequence[Sample], whiten: bool = True, weighting: str = "token",
                 constant_normaliser: int = 0) -> StepTargets:
    """Advantages whitened (``whiten=False``: centred) per (slot, group), each sequence weighted by its tokens or
    once (``weighting``; ``group_normalised_advantages``), and N_a, over every sample of the step: the same numbers
    whichever learner later trains which sample. A supervised target (``Sample.fixed_advantage``) keeps its own
    advantage and joins no group; its tokens count in N_a. N_a is slot a's completion tokens, or with ``constant_normaliser``
    L > 0 its sequences times L (Dr. GRPO's constant; ``learners.pg_loss``)."""
    if not samples:
        raise ValueError("step_targets needs at least one sample")
    if constant_normaliser < 0:
        raise ValueError(f"constant_normaliser must be >= 0 (0: the token count), got {constant_normaliser}")
    advantages = torch.zeros(len(samples))
    sampled = [i for i, s in enumerate(samples) if s.fixed_advantage is None]  # supervised targets join no group
    if sampled:
        advantages[sampled] = group_normalised_advantages(
            [samples[i].reward for i in sampled], [(samples[i].slot, samples[i].group) for i in sampled],
            [len(samples[i].completion_ids) for i in sampled], whiten=whiten, weighting=weighting,
        )
    for i, s in enumerate(samples):
        if s.fixed_advantage is not None:
            advantages[i] = float(s.fixed_advantage)
    totals: dict[int, float] = defaultdict(float)
    for s in samples:
        totals[s.slot] += constant_normaliser if constant_normaliser else len(s.completion_ids)
    return StepTargets(advantages, dict(totals))


def split_by_tokens(token_counts: Sequence[int], shares: int, keys: Sequence[Hashable] | None = None) -> list[list[int]]:
    """Assign items (samples, by their token counts n_i) to ``shares`` = K lists with balanced token sums,
    splitting as few keys (members) as possible: McNaughton's wrap-around rule at item granularity.

    The items are laid end to end, grouped by key (keys in order of first appearance, items of a key in
    index order; no keys = one group), T = sum n_i; with c_i the tokens laid before item i, item i goes to
    share k_i = min(K - 1, floor((c_i + n_i / 2) K / T)), the share its midpoint falls in. So every share
    holds T / K tokens within the longest item (|load_k - T / K| <= max n_i), shares follow the line
    (each key's shares are consecutive) and at most K - 1 keys are split, which bounds the gradients to
    exchange. Deterministic; every index appears exactly once; each list ascends. With T = 0 all go to share 0.
    """
    if shares < 1:
        raise ValueError(f"shares must be >= 1, got {shares}")
    if any(n < 0 for n in token_counts):
        raise ValueError("token counts must be >= 0")
    if keys is not None and len(keys) != len(token_counts):
        raise ValueError(f"{len(keys)} keys for {len(token_counts)} token counts")
    groups: dict[Hashable, list[int]] = {}
    for i in range(len(token_counts)):
        groups.setdefault(None if keys is None else keys[i], []).append(i)
    total = sum(token_counts)
    out: list[list[int]] = [[] for _ in range(shares)]
    laid = 0
    for i in (i for members in groups.values() for i in members):
        k = 0 if total == 0 else min(shares - 1, (2 * laid + token_counts[i]) * shares // (2 * total))
        out[k].append(i)
        laid += token_counts[i]
    return [sorted(idx) for idx in out]


def split_samples(samples: Sequence[Sample], shares: int) -> list[list[int]]:
    """The shares of a step: :func:`split_by_tokens` over ``len(sample)`` (prompt + completion tokens, what a
    learner computes), keyed by slot, so a member's samples stay together except at the K - 1 cuts."""
    return split_by_tokens([len(s) for s in samples], shares, [s.slot for s in samples])


@dataclass
class SlotGradients:
    """One epoch's gradients of one share (or the sum of several), per adapter slot, with statistics' sums.

    ``grads[a]`` is slot a's gradient flattened in ``MultiLoRAModel.slot_parameters(a)`` order (float32);
    ``sums[a]`` holds additive statistics (token counts, loss, token-weighted sums) that add across shares.
    """

    grads: dict[int, torch.Tensor] = field(default_factory=dict)
    sums: dict[int, dict[str, float]] = field(default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        # As numpy arrays: pickle protocol 5 hands their bytes out of band, so Ray's object store holds one copy
        # and a reader in another process maps it without copying (a torch tensor pickles into a byte string).
        return {"grads": {a: g.detach().cpu().numpy() for a, g in self.grads.items()}, "sums": self.sums}

    def __setstate__(self, state: dict[str, Any]) -> None:
        with warnings.catch_warnings():  # read-only when mapped from the object store: never written (sum_gradients copies)
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.grads = {a: torch.from_numpy(g) for a, g in state["grads"].items()}
        self.sums = state["sums"]

    def to(self, device: torch.device | str) -> "SlotGradients":
        """The same gradients on ``device`` (the statistics are plain floats)."""
        return SlotGradients({a: g.to(device) for a, g in self.grads.items()}, {a: dict(s) for a, s in self.sums.items()})


def sum_gradients(parts: Sequence[SlotGradients]) -> SlotGradients:
    """g_a = sum_k parts[k].grads[a] over the parts holding slot a, added in list order (so the sum is the
    same bits on every replica); the statistics' sums add key by key likewise. A slot in one part only is
    that part's gradient (copied)."""
    grads: dict[int, torch.Tensor] = {}
    sums: dict[int, dict[str, float]] = {}
    for part in parts:
        for slot in sorted(part.grads):
            g = part.grads[slot]
            if slot in grads:
                if grads[slot].shape != g.shape:
                    raise ValueError(f"slot {slot}: gradients of {tuple(g.shape)} and {tuple(grads[slot].shape)} elements")
                grads[slot] = grads[slot] + g.to(grads[slot].device)
            else:
                grads[slot] = g.clone()
        for slot, st in part.sums.items():
            into = sums.setdefault(slot, {})
            for key, value in st.items():
                into[key] = into.get(key, 0.0) + value
    return SlotGradients(grads, sums)


def export_slot_gradients(model: MultiLoRAModel, slots: Sequence[int], device: torch.device | str = "cpu") -> dict[int, torch.Tensor]:
    """Each slot's ``.grad`` tensors flattened into one vector on ``device``; the model's gradients of those
    slots are cleared (set to None). A slot with no gradient at all is left out; one with a gradient on only
    some of its tensors is an error (a zero and an absent gradient step AdamW differently)."""
    out: dict[int, torch.Tensor] = {}
    for slot in sorted(set(slots)):
        params = model.slot_parameters(slot)
        have = [p.grad is not None for p in params]
        if not any(have):
            continue
        if not all(have):
            raise ValueError(f"slot {slot}: {have.count(False)} of its {len(params)} tensors got no gradient")
        out[slot] = torch.cat([p.grad.reshape(-1) for p in params]).to(device, torch.float32)
        for p in params:
            p.grad = None
    return out


def import_slot_gradients(model: MultiLoRAModel, grads: dict[int, torch.Tensor]) -> None:
    """Set each slot's ``.grad`` tensors from its flat vector (copies on the parameters' device and dtype;
    the vector itself is never written, so one sum can be imported into several replicas)."""
    for slot, flat in grads.items():
        params = model.slot_parameters(slot)
        sizes = [p.numel() for p in params]
        if flat.dim() != 1 or flat.numel() != sum(sizes):
            raise ValueError(f"slot {slot}: a gradient of {tuple(flat.shape)} for {sum(sizes)} parameters")
        for p, chunk in zip(params, flat.split(sizes)):
            p.grad = chunk.view_as(p).to(device=p.device, dtype=p.dtype, copy=True)


# What each quantity of a fingerprint (learners.adapter_optim.FINGERPRINT) is, for messages.
_HELD = {
    "step": ("optimizer states", "AdamW step count"),
    "param_sum": ("weights", "parameter sum"),
    "param_sq_sum": ("weights", "parameter sum of squares"),
    "exp_avg_sum": ("optimizer states", "AdamW first-moment sum"),
    "exp_avg_sq_sum": ("optimizer states", "AdamW second-moment sum"),
}


@dataclass
class AppliedGradients:
    """What one replica reports after applying an epoch's summed gradients (``LearnerActor.apply_gradients``).

    ``held[m]`` is the fingerprint (``AdapterOptimizers.fingerprint``) of member m's slot right after the apply,
    for every member the apply concerned; ``stats`` are the per-member statistics after the step's last epoch
    ({} before it). ``replica`` names the reporter in messages (its learner and share index).
    """

    replica: str
    epoch: int  # 1-based, of ``epochs``
    epochs: int
    held: dict[Hashable, dict[str, float]]
    stats: dict[Hashable, dict[str, float]] = field(default_factory=dict)


def same_value(a: Any, b: Any) -> bool:
    """a == b, with NaN equal to NaN (a statistic of a skipped, non-finite step is nan on every replica)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys (in ``a``'s order, then ``b``'s) whose values differ by :func:`same_value` or that only one of
    them has; [] when they agree."""
    return [key for key in list(a) + [k for k in b if k not in a]
            if key not in a or key not in b or not same_value(a[key], b[key])]


def check_replicas(applied: Sequence[AppliedGradients]) -> None:
    """Raise ``RuntimeError`` unless every replica's report of a member agrees with the first one's, apply by
    apply: the fingerprints exactly (NaN == NaN) and, after the last epoch, the statistics (NaN == NaN).

    Healthy replicas are bit-identical (they apply the same gradient bits to the same state), so any
    difference means one diverged (a perturbed weight or moment, a missed step); the message names the
    member, the two replicas and each quantity that differs. The statistics alone could not tell:
    every replica computes them from the same summed gradients whatever it holds.
    """
    first: dict[tuple[int, Hashable], tuple[AppliedGradients, dict[str, float]]] = {}
    stats: dict[Hashable, tuple[AppliedGradients, dict[str, float]]] = {}
    for report in sorted(applied, key=lambda r: r.epoch):
        for kind, member, values in ([("held", m, v) for m, v in report.held.items()]
                                     + [("stats", m, v) for m, v in report.stats.items()]):
            seen, theirs = (first.setdefault((report.epoch, member), (report, values)) if kind == "held"
                            else stats.setdefault(member, (report, values)))
            keys = differences(theirs, values)
            if not keys:
                continue
            if kind == "held":
                what = " and ".join(dict.fromkeys(_HELD.get(k, ("state", k))[0] for k in keys))
                names = {k: _HELD.get(k, ("", k))[1] for k in keys}
                diverged = f"hold different {what}"
            else:
                names, diverged = {k: k for k in keys}, "report different statistics"
            detail = ", ".join(f"{names[k]} {theirs.get(k)!r} vs {values.get(k)!r}" for k in keys)
            raise RuntimeError(f"the replicas of {member} {diverged} after the apply of epoch {report.epoch} of "
                               f"{report.epochs} ({detail}; on {seen.replica} vs {report.replica}): they have diverged")
