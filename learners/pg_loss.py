"""Token-level policy-gradient loss with task-relative advantages, PPO clipping, truncated importance weights
against the behaviour policy, KL to the base, entropy bonus.

Advantages (AZR's Task-Relative REINFORCE++): every completion token carries its sequence's reward r
(gamma = 1, terminal reward), then rewards are normalised within each (adapter, role, task family) group.
With weights w_i (``rl.advantage_weighting``: ``token``, w_i = n_i the completion tokens of sequence i;
``sequence``, w_i = 1):

    mu_g = sum_i w_i r_i / sum_i w_i,   var_g = sum_i w_i (r_i - mu_g)^2 / sum_i w_i,
    A_i = (r_i - mu_g) / sqrt(var_g + eps)      (``rl.advantage_norm: whiten``)
    A_i = r_i - mu_g                            (``rl.advantage_norm: center``)

Which paper each combination is:

- ``token`` + ``whiten`` (the default): veRL's masked whitening (``verl.utils.torch_functional.masked_whiten``,
  mean and variance over every completion token of the group), which AZR's REINFORCE++ code runs. Per token the
  shorter of two completions carries the larger advantage whichever way the reward points: lengths 40 and 80,
  rewards 0.75 and 0, centred: +0.50 / -0.25; with the winner the longer, +0.25 / -0.50 (whitened +1.41 / -0.71
  and +0.71 / -1.41). Summed over each completion the two are equal and opposite. A group of two whitens to
  +-1 only when the two have equal lengths.
- ``sequence`` + ``whiten``: GRPO's group normalisation (Shao et al. 2024, DeepSeekMath), each output one
  weight (the population variance here; GRPO's code divides by the sample std). A group of two whitens to +-1.
- ``sequence`` + ``center`` with ``rl.loss_normaliser: constant``: Dr. GRPO (Liu et al. 2025, "Understanding
  R1-Zero-like training"): the unweighted group mean, no std, and a constant normaliser in place of the token
  count (below).
- ``token`` + ``center``: the token-weighted mean without the std; no paper, kept as the earlier studies ran it.

The loss of adapter a divides its token sum by N_a (``rl.loss_normaliser``): ``tokens``, N_a = its completion
tokens in the step (a token-level mean, DAPO's, Yu et al. 2025), or ``constant``, N_a = S_a L_max (S_a its
sequences, L_max = ``inference.max_tokens``: Dr. GRPO's constant, so a sequence's weight does not fall with
the lengths of the others).

Three policies meet in a token's loss: pi, the adapter being trained; pi_old, the same adapter before this
step's update (the proximal policy: pi detached with one epoch, a no-grad pass before the first of several);
and mu, the behaviour policy that sampled y_t: the engine's distribution (temperature and top-p applied,
``inference.requests``) under the adapter version it served, which is older than pi_old when generation
runs ahead of training, and differs from it by the engine's kernels even when it is not.

Per token t of adapter a (PPO, Schulman et al. 2017; k3 KL estimator, Schulman 2020):

    rho_t = exp(log pi(y_t) - log pi_old(y_t))
    w_t   = min(exp(log pi_old(y_t) - log mu(y_t)), C)      (detached; w_t = 1 with the correction off)
    l_t   = -w_t min(rho_t A, clip(rho_t, 1 - eps, 1 + eps) A)
            + beta_kl * (exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1)
            - beta_ent * H(pi(. | y_<t))
    L     = sum_a (1 / N_a) sum_{t in a} l_t                     (N_a: rl.loss_normaliser, above)

w_t is truncated importance sampling (TIS) at the token level: the ratio of the proximal to the behaviour
policy, cut at C (``rl.is_truncation``, 2 as veRL's ``rollout_is_threshold``; veRL docs/algo/rollout_corr.md;
Ionides 2008, "Truncated importance sampling"). With several epochs the product w_t * clipped(rho_t) is the
decoupled PPO objective of AReaL (Fu et al. 2025, "AReaL: a large-scale asynchronous reinforcement learning
system", the behaviour weight pi_prox / mu times PPO's clipped ratio to the proximal policy pi_prox), with
its behaviour weight truncated. With one epoch rho_t = 1 in value and the gradient is
-w_t A grad log pi(y_t): REINFORCE with each token weighted by min(pi / mu, C).

Summing per-adapter token means (instead of one mean over the whole batch) makes each adapter's gradient
independent of what else shares its batch: a mixed batch trains every adapter exactly as its own pass.
With one update per batch and the correction off, pi_old = pi (detached), rho = w = 1 and the loss is plain
REINFORCE with the whitened advantage: no ratio to the sampling policy is taken. The reference pi_ref is the
frozen base: the same model with the adapter off.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch


IMPORTANCE_CORRECTIONS = ("off", "tis")


@dataclass(frozen=True)
class PGConfig:
    """Loss coefficients (DESIGN.md "RL update"; AZR paper branch: clip 0.2, entropy 0.001, no KL).

    ``importance_correction``: ``"tis"`` weighs each token by w_t = min(pi_old / mu, ``is_truncation``)
    (module docstring) and needs the behaviour log-probs; ``"off"`` takes w_t = 1.
    """

    clip_epsilon: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    importance_correction: str = "off"
    is_truncation: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.clip_epsilon < 1:
            raise ValueError(f"clip_epsilon must be in (0, 1), got {self.clip_epsilon}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError(f"kl_coef and entropy_coef must be >= 0, got {self.kl_coef}, {self.entropy_coef}")
        if self.importance_correction not in IMPORTANCE_CORRECTIONS:
            raise ValueError(f"importance_correction must be one of {IMPORTANCE_CORRECTIONS}, got {self.importance_correction!r}")
        if not self.is_truncation >= 1.0:
            raise ValueError(f"is_truncation must be >= 1 (a weight cap below 1 would shrink on-policy tokens), got {self.is_truncation}")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] = logit[target] - logsumexp(logits), in float32; logits [..., V], targets [...]."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v, per position; logits [..., V]."""
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def token_kl(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) = sum_v p_v (log p_v - log q_v), p = softmax(logits_p), q = softmax(logits_q), per position, summed
    over the whole vocabulary (exact, not a sampled estimator), in float32; logits [..., V]."""
    log_p = torch.log_softmax(logits_p.float(), dim=-1)
    log_q = torch.log_softmax(logits_q.float(), dim=-1)
    return torch.nn.functional.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)


ADVANTAGE_WEIGHTINGS = ("token", "sequence")


def group_normalised_advantages(
    rewards: Sequence[float] | torch.Tensor,
    groups: Sequence[Hashable],
    token_counts: Sequence[int] | torch.Tensor,
    eps: float = 1e-6,
    whiten: bool = True,
    weighting: str = "token",
) -> torch.Tensor:
    """Whitening (``whiten=False``: centring) of sequence rewards within each group, each sequence weighted by
    its completion tokens (``weighting="token"``) or once (``"sequence"``): the formulas of the module docstring.

    ``groups[i]`` is any hashable key, normally ``(adapter, role, family)``. A group whose rewards are all
    equal (or that has one member) gets advantage exactly 0, whatever ``eps``. Returns one float32 advantage per sequence.
    """
    if weighting not in ADVANTAGE_WEIGHTINGS:
        raise ValueError(f"advantage weighting must be one of {ADVANTAGE_WEIGHTINGS}, got {weighting!r}")
    r = torch.as_tensor(rewards, dtype=torch.float64)
    n = torch.as_tensor(token_counts, dtype=torch.float64)
    if r.dim() != 1 or n.shape != r.shape or len(groups) != r.numel():
        raise ValueError(
            f"rewards ({tuple(r.shape)}), groups ({len(groups)}) and token_counts ({tuple(n.shape)}) must be 1-D and the same length"
        )
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite")
    if (n <= 0).any():
        raise ValueError("every sequence needs at least one completion token (token_counts > 0)")
    w = n if weighting == "token" else torch.ones_like(n)
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    adv = torch.zeros_like(r)
    for idx in members.values():
        rows = torch.tensor(idx)
        rg, wg = r[rows], w[rows]
        mean = (wg * rg).sum() / wg.sum()
        var = (wg * (rg - mean) ** 2).sum() / wg.sum()
        if var > 0:
            adv[rows] = (rg - mean) / torch.sqrt(var + eps) if whiten else rg - mean
    return adv.float()


@dataclass
class PGLossOutput:
    """The scalar to backpropagate and, per adapter slot, detached sums for statistics."""

    loss: torch.Tensor
    stats: dict[int, dict[str, float]]


def policy_gradient_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    slots: torch.Tensor,
    config: PGConfig,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    slot_token_totals: dict[int, float] | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
) -> PGLossOutput:
    """The loss of the module docstring over N loss tokens (all tensors shape [N], one entry per token).

    ``slots`` gives each token's adapter. ``slot_token_totals[a]`` is N_a, the token count that adapter a's
    sum is divided by; pass the whole step's counts when a step is split into micro-batches (default: the
    counts in this call). ``old_logprobs`` None means on-policy (rho = 1). ``ref_logprobs`` is required
    when ``config.kl_coef`` > 0, ``entropy`` when ``config.entropy_coef`` > 0, ``behaviour_logprobs``
    (log mu(y_t)) when ``config.importance_correction`` is ``"tis"`` (ignored when it is ``"off"``).

    Stats per slot (token means over this call): ``loss``, ``pg_loss``, ``kl``, ``entropy``,
    ``clip_fraction`` (tokens whose clipped branch was taken), ``ratio``, ``advantage``, ``tokens``; with
    ``"tis"`` also ``is_weight`` (w_t after truncation), ``is_truncated`` (tokens with pi_old / mu > C) and
    ``behaviour_kl``, the k3 estimate r - 1 - log r (r = pi_old / mu) of KL(mu || pi_old) from tokens drawn from mu.
    """
    n = logprobs.shape
    if logprobs.dim() != 1 or advantages.shape != n or slots.shape != n:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, advantages {tuple(advantages.shape)} and slots {tuple(slots.shape)} must all be [N]"
        )
    tis = config.importance_correction == "tis"
    if tis and behaviour_logprobs is None:
        raise ValueError("importance_correction 'tis' needs behaviour_logprobs (log mu of every token)")
    for name, t in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs), ("entropy", entropy),
                    ("behaviour_logprobs", behaviour_logprobs if tis else None)):
        if t is not None and t.shape != n:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(n)}")
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (log-probs of the adapter-off base)")
    if config.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the per-token entropy")

    old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    ratio = torch.exp(logprobs - old)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - config.clip_epsilon, 1 + config.clip_epsilon) * advantages
    pg = -torch.minimum(unclipped, clipped)
    if tis:
        log_w = (old - behaviour_logprobs.detach().to(old.dtype)).double()
        truncated = log_w > math.log(config.is_truncation)
        weight = torch.exp(log_w).clamp(max=config.is_truncation)
        behaviour_kl = torch.expm1(log_w) - log_w  # k3: r - 1 - log r >= 0, r = pi_old / mu
        pg = pg * weight.to(pg.dtype)
    per_token = pg
    kl = None
    if ref_logprobs is not None:
        log_r = ref_logprobs.detach() - logprobs
        kl = torch.exp(log_r) - log_r - 1
        if config.kl_coef > 0:
            per_token = per_token + config.kl_coef * kl
    if entropy is not None and config.entropy_coef > 0:
        per_token = per_token - config.entropy_coef * entropy
    clip_taken = (clipped < unclipped).float()

    loss = logprobs.new_zeros(())
    stats: dict[int, dict[str, float]] = {}
    for slot in torch.unique(slots).tolist():
        mask = slots == slot
        count = int(mask.sum())
        total = float(slot_token_totals[slot]) if slot_token_totals is not None else float(count)
        if total <= 0:
            raise ValueError(f"slot_token_totals[{slot}] must be > 0")
        slot_loss = per_token[mask].sum() / total
        loss = loss + slot_loss
        stats[slot] = {
            "loss": float(slot_loss.detach()),
            "pg_loss": float(pg[mask].detach().mean()),
            "kl": float(kl[mask].detach().mean()) if kl is not None else 0.0,
            "entropy": float(entropy[mask].detach().mean()) if entropy is not None else 0.0,
            "clip_fraction": float(clip_taken[mask].mean()),
            "ratio": float(ratio[mask].detach().mean()),
            "advantage": float(advantages[mask].mean()),
            "tokens": float(count),
        }
        if tis:
            stats[slot].update(is_weight=float(weight[mask].mean()), is_truncated=float(truncated[mask].double().mean()),
                               behaviour_kl=float(behaviour_kl[mask].mean()))
    return PGLossOutput(loss=loss, stats=stats)
